//! The agent's answers, routed by the id of the request each answers to the call that waits
//! for it: calls need not take turns to read them, so that a request the agent answers at once
//! (a background process's) is answered while an exec runs.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::protocol::Answer;

/// The calls waiting for answers, by request id.
#[derive(Debug, Default)]
pub(super) struct Router {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    waiting: HashMap<u64, mpsc::UnboundedSender<Answer>>,
    /// The agent is gone: no answer will come, and a call that registers now sees it at once.
    closed: bool,
}

/// One call's answers, until it is dropped.
#[derive(Debug)]
pub(super) struct Route<'a> {
    router: &'a Router,
    id: u64,
    pub(super) answers: mpsc::UnboundedReceiver<Answer>,
}

impl Router {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the answers to request `id`: register before the request is sent.
    pub(super) fn register(&self, id: u64) -> Route<'_> {
        let (tx, answers) = mpsc::unbounded_channel();
        let mut state = self.state();
        if !state.closed {
            state.waiting.insert(id, tx);
        }
        Route {
            router: self,
            id,
            answers,
        }
    }

    /// Hands an answer to the call waiting for it; one that nobody waits for (a call given
    /// up, a line without an id) is dropped.
    pub(super) fn route(&self, answer: Answer) {
        let state = self.state();
        if let Some(tx) = answer.id.and_then(|id| state.waiting.get(&id)) {
            let _ = tx.send(answer);
        }
    }

    /// The agent has ended: every waiting call sees its answers end.
    pub(super) fn close(&self) {
        let mut state = self.state();
        state.closed = true;
        state.waiting.clear();
    }
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        self.router.state().waiting.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::protocol::Event;

    fn answer(id: Option<u64>) -> Answer {
        Answer {
            id,
            event: Event::Ok { size: None },
        }
    }

    #[test]
    fn each_call_gets_its_own_answers_and_none_after_the_end() {
        let router = Router::default();
        let mut one = router.register(1);
        let mut two = router.register(2);
        router.route(answer(Some(2)));
        router.route(answer(Some(1)));
        router.route(answer(Some(3)));
        router.route(answer(None));
        assert_eq!(one.answers.try_recv().unwrap().id, Some(1));
        assert_eq!(two.answers.try_recv().unwrap().id, Some(2));
        assert!(one.answers.try_recv().is_err(), "only its own");
        drop(two);
        assert_eq!(
            router.state().waiting.len(),
            1,
            "a dropped call is forgotten"
        );
        router.close();
        assert!(matches!(
            one.answers.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        ));
        let mut late = router.register(4);
        assert!(matches!(
            late.answers.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        ));
    }
}
