//! What every tier's plan tells the channel, so that `recv_plan` reads any of them.

/// A helper's plan: from which build it comes, and how many input files follow it.
pub trait Planned {
    /// The build that made the plan (the supervisor's `channel::BUILD`).
    fn build(&self) -> &str;
    /// How many input files follow the plan on the channel.
    fn files(&self) -> usize;
}
