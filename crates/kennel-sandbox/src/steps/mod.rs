//! The step tables: every sequence Kennel runs to set a sandbox up, one flat, ordered list of
//! named steps per tier, each with its reason. A table is vocabulary, not a tier: `error.rs`
//! names a failed step through it (`Error::Setup`, `SetupStep`), the helpers report one over
//! the control channel, and each tier's own module holds the code that runs its steps.
//!
//! Every table is written with the one `steps!` macro, and each module's tests
//! assert its order.

/// A step table: the enum `Step`, in the sequence's order, with `ALL` (that order), `name` (the
/// step as errors and the control channel name it) and `reason` (why the step is there, and
/// why at this point). Each entry reads `Variant = "name", "reason";`.
macro_rules! steps {
    ($( $(#[$doc:meta])* $name:ident = $text:literal, $why:literal; )*) => {
        /// Every step of the sequence, in its order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Step { $( $(#[$doc])* $name, )* }

        impl Step {
            /// The whole sequence, in order.
            pub const ALL: &'static [Step] = &[$(Step::$name),*];

            /// The step's name, as errors and the control channel spell it.
            pub fn name(self) -> &'static str {
                match self { $(Step::$name => $text,)* }
            }

            /// Why the step is there, and why at this point of the sequence.
            pub fn reason(self) -> &'static str {
                match self { $(Step::$name => $why,)* }
            }
        }

        impl std::fmt::Display for Step {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

// After the macro: a `macro_rules!` is seen by the modules declared below it.
pub mod docker;
pub mod microvm;
pub mod native;
pub mod oci;

#[cfg(test)]
mod tests {
    /// Every table spells each step once, as serde does, and gives it a reason: the name a
    /// failure travels under is the one its table shows.
    #[test]
    fn every_table_names_each_step_once_with_a_reason() {
        fn check<S: Copy + std::fmt::Debug + serde::Serialize>(
            all: &[S],
            name: fn(S) -> &'static str,
            reason: fn(S) -> &'static str,
        ) {
            let names: std::collections::HashSet<_> = all.iter().map(|&s| name(s)).collect();
            assert_eq!(names.len(), all.len(), "a name used twice in {all:?}");
            for &s in all {
                assert_eq!(serde_json::to_value(s).unwrap(), name(s), "{s:?}");
                assert!(!reason(s).is_empty(), "{s:?} has no reason");
            }
        }
        check(super::native::Step::ALL, |s| s.name(), |s| s.reason());
        check(super::oci::Step::ALL, |s| s.name(), |s| s.reason());
        check(super::microvm::Step::ALL, |s| s.name(), |s| s.reason());
        check(super::docker::Step::ALL, |s| s.name(), |s| s.reason());
    }
}
