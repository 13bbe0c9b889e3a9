//! How the relay and the guest agent charge a failure to a step of `crate::steps::microvm`.

use crate::native::steps::Fail;
use crate::steps::microvm::Step;

/// A failed step of the relay's or the guest agent's, with why: what each reports as
/// `Msg::Failed`.
pub(super) type Failed = (Step, Fail);

/// Charges a failure to `step`.
pub(super) fn at(step: Step) -> impl FnOnce(Fail) -> Failed {
    move |f| (step, f)
}
