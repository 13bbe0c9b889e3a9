//! `kennel-sandbox-helper`: what the kennel binary does when it is a sandbox helper, in a
//! binary small enough to start fast. `kennel` exec's it when it sits beside it.

#![forbid(unsafe_code)]

fn main() {
    kennel_sandbox::run_helper()
}
