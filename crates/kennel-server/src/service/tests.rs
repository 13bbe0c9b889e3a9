use std::sync::Arc;

use super::error::{count, RUN_SLOT_RETRY};
use super::*;
use crate::audit::Audit;
use crate::config::ServerConfig;
use crate::pool::Pool;
use kennel_sandbox::Engine;
use kennel_types::api::{RunSpec, SessionSpec};
use kennel_types::policy::{Runtime, Strength, Tier};

#[test]
fn an_error_is_its_code_and_message_on_the_wire() {
    let all = [
        ServiceError::BadRequest("m".into()),
        ServiceError::NotFound("m".into()),
        ServiceError::Forbidden("m".into()),
        ServiceError::TooLarge("m".into()),
        ServiceError::SessionEnded("m".into()),
        ServiceError::Busy("m".into()),
        ServiceError::QuotaExceeded("m".into()),
        ServiceError::Unsupported("m".into()),
        ServiceError::SandboxFailed("m".into()),
        ServiceError::Internal("m".into()),
    ];
    for e in all {
        let wire = serde_json::to_value(&e).unwrap();
        assert_eq!(wire, serde_json::json!({"code": e.code(), "message": "m"}));
        assert_eq!(serde_json::from_value::<ServiceError>(wire).unwrap(), e);
    }
}

/// A service whose engine cannot start anything: only the refusals before a sandbox is made
/// can be asked of it.
fn service(config: ServerConfig) -> Arc<Service> {
    let engine = Arc::new(Engine::with_helper("/nonexistent".into()));
    let policy = config.base_policy();
    let minute = std::time::Duration::from_secs(60);
    let pool = Arc::new(Pool::new(
        engine.clone(),
        policy,
        &Default::default(),
        minute,
        minute,
    ));
    let audit = Audit::open(None).unwrap();
    Arc::new(Service::new(config, engine, audit, pool))
}

fn code_run() -> RunSpec {
    RunSpec {
        language: Some(kennel_types::api::Language::Python),
        code: Some("print(1)".into()),
        ..RunSpec::default()
    }
}

#[tokio::test]
async fn a_streaming_run_refused_before_it_starts_is_never_accepted() {
    let full = service(ServerConfig {
        max_concurrent: 0,
        ..ServerConfig::default()
    });
    let (live, accepted) = Live::new(Arc::new(|_, _| {}));
    let action = Action::Run {
        spec: Box::new(code_run()),
        live: Some(live),
    };
    let refused = full.handle(&Caller::anonymous(), action).await.unwrap_err();
    assert_eq!(
        refused,
        ServiceError::Busy(Refusal::retry_in("too many runs at once", RUN_SLOT_RETRY))
    );
    // An HTTP caller answers it as a plain 429, not as an event of a stream.
    assert!(accepted.await.is_err());
}

#[tokio::test]
async fn the_callers_rules_come_before_any_sandbox() {
    let strict = service(ServerConfig {
        min_isolation: Some(Strength::Gvisor),
        ..ServerConfig::default()
    });
    let caller = Caller::anonymous();
    let session = strict
        .handle(
            &caller,
            Action::CreateSession {
                spec: SessionSpec {
                    tier: Some(Tier::Native),
                    ..SessionSpec::default()
                },
            },
        )
        .await
        .unwrap_err();
    // A session is held to the caller's minimum as a run is, with the run's answer.
    assert!(
        matches!(&session, ServiceError::BadRequest(m) if m.contains("`tier`") && m.contains("Gvisor")),
        "{session:?}"
    );
    let mismatched = strict
        .handle(
            &caller,
            Action::CreateSession {
                spec: SessionSpec {
                    tier: Some(Tier::Microvm),
                    runtime: Some(Runtime::Runsc),
                    ..SessionSpec::default()
                },
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&mismatched, ServiceError::BadRequest(m) if m.contains("`runtime`")),
        "{mismatched:?}"
    );
    assert_eq!(strict.sessions.len(), 0, "no session was made");
    let outside = RunSpec {
        collect: vec!["/etc/passwd".into()],
        ..code_run()
    };
    let run = strict
        .handle(
            &caller,
            Action::Run {
                spec: Box::new(outside),
                live: None,
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&run, ServiceError::BadRequest(m) if m.contains("`collect`")),
        "{run}"
    );
    let missing = Action::ShowSession { id: "x".into() };
    assert!(matches!(
        strict.handle(&caller, missing).await,
        Err(ServiceError::NotFound(_))
    ));
    assert!(matches!(
        strict
            .handle(&caller, Action::ListSessions { filter: SessionFilter::default() })
            .await,
        Ok(Reply::Sessions(all)) if all.is_empty()
    ));
}

/// Counts read as English: one thing in the singular.
#[test]
fn counts_are_singular_for_one() {
    assert_eq!(count(1, "session"), "1 session");
    assert_eq!(count(0, "session"), "0 sessions");
    assert_eq!(count(2, "run"), "2 runs");
}
