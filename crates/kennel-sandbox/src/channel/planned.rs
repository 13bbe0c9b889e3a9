//! What every tier's plan tells the channel, so that `recv_plan` reads any of them.

/// A helper's plan: from which build it comes, and how many input files follow it.
pub trait Planned {
    fn build(&self) -> &str;
    fn files(&self) -> usize;
}
