//! The Python SDK's agent-framework adapters (`sdk/python/kennel/adapters`), each tested with
//! the framework's own package from PyPI at the version its extra pins
//! (`sdk/python/requirements/EXTRA.txt`), in a virtualenv of its own made by
//! scripts/adapter-venvs.sh (run by scripts/setup-ci.sh), against this build's `kennel`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn venvs() -> PathBuf {
    std::env::var_os("KENNEL_VENVS").map_or_else(
        || PathBuf::from("/var/cache/kennel-tests/venvs"),
        PathBuf::from,
    )
}

/// Runs `sdk/python/tests/adapters/test_EXTRA.py` with the extra's virtualenv.
fn adapter_tests_pass(extra: &str) {
    let python = venvs().join(extra).join("bin/python");
    if !common::require(
        &format!("the {extra} virtualenv (scripts/adapter-venvs.sh {extra})"),
        python.exists(),
    ) {
        return;
    }
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk/python");
    let test = format!("tests/adapters/test_{}.py", extra.replace('-', "_"));
    let report = common::client_tests(
        Command::new(&python)
            .args(["-B", "-m", "pytest", "-q", &test])
            .current_dir(&sdk)
            .env("PYTHONPATH", &sdk),
        &format!("{extra}: the adapter's tests"),
    );
    assert!(report.contains(" passed"), "{report}");
}

/// LangChain Deep Agents (`deepagents`): a `BaseSandbox`.
#[test]
fn langchain_deep_agents() {
    adapter_tests_pass("langchain");
}

/// The OpenAI Agents SDK (`openai-agents`): its sandbox client and session.
#[test]
fn openai_agents() {
    adapter_tests_pass("openai-agents");
}

/// smolagents: an executor for `CodeAgent(executor=...)`.
#[test]
fn smolagents() {
    adapter_tests_pass("smolagents");
}

/// pydantic-ai: a workspace backend, with the conformance suite pydantic-ai ships.
#[test]
fn pydantic_ai() {
    adapter_tests_pass("pydantic-ai");
}

/// AutoGen (`autogen-core`): a `CodeExecutor`.
#[test]
fn autogen() {
    adapter_tests_pass("autogen");
}
