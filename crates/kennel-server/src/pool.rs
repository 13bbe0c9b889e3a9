//! The warm pool: pre-started agent sandboxes per profile, each handed out once. Native ones
//! on the host view and on images, and microVM clones per image: the session agent's guest,
//! saved once it had imported the image's preloads and answered a ping, restored for each.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::agent::AgentSandbox;
use kennel_sandbox::Engine;
use kennel_sandbox::BASE_IMAGE;
use kennel_types::api::{Command, Language, RunRequest};
use kennel_types::policy::{Limits, Policy, Tier};

/// What a pooled sandbox has warm: a python interpreter, or (for shell code) just the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    Python,
    Shell,
}

impl Profile {
    pub fn of(language: Language) -> Profile {
        match language {
            Language::Python => Profile::Python,
            Language::Bash | Language::Sh => Profile::Shell,
        }
    }
}

/// Sandboxes of one kind starting at once, at most.
const REFILL_BATCH: usize = 4;

/// The tiers whose sandboxes are pre-started: a request for any other tier starts cold.
pub const POOLED_TIERS: [Tier; 2] = [Tier::Native, Tier::Microvm];

/// The part of a policy that makes the sandbox: the policy with the limits that a pooled
/// sandbox applies per run (the timeout, the output cap and the collect cap, which the agent
/// takes with each exec) reset to their defaults. Two policies with the same shape give the
/// same sandbox.
///
/// Both structs are destructured without `..`, so a field added to either one does not compile
/// until it is sorted here into "shapes the sandbox" or "applied per run".
pub fn shape(policy: &Policy) -> Policy {
    let Policy {
        tier,
        oci,
        microvm,
        limits,
        filesystem,
        network,
        layers,
        capabilities,
        env,
        on_violation,
        tripwires,
    } = policy.clone();
    let Limits {
        timeout: _,
        output: _,
        collect_size: _,
        memory,
        cpus,
        pids,
        tmp_size,
        workspace_size,
        open_files,
    } = limits;
    let per_run = Limits::default();
    Policy {
        tier,
        oci,
        microvm,
        limits: Limits {
            memory,
            cpus,
            pids,
            tmp_size,
            workspace_size,
            open_files,
            timeout: per_run.timeout,
            output: per_run.output,
            collect_size: per_run.collect_size,
        },
        filesystem,
        network,
        layers,
        capabilities,
        env,
        // The watcher that decides on tripwires starts with the sandbox.
        on_violation,
        tripwires,
    }
}

/// What a pooled sandbox is: its tier, its profile, and the image it runs on (the host's
/// system view when none; a microVM always boots one).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Kind {
    pub tier: Tier,
    pub profile: Profile,
    pub image: Option<String>,
}

impl Kind {
    pub fn host(profile: Profile) -> Kind {
        Kind {
            tier: Tier::Native,
            profile,
            image: None,
        }
    }
    /// A native python sandbox on `image`.
    pub fn image(name: &str) -> Kind {
        Kind {
            tier: Tier::Native,
            profile: Profile::Python,
            image: Some(name.into()),
        }
    }
    /// A microVM clone of `image`, running python.
    pub fn clone_of(name: &str) -> Kind {
        Kind {
            tier: Tier::Microvm,
            ..Kind::image(name)
        }
    }
}

/// How many sandboxes of each kind the pool keeps ready.
#[derive(Debug, Clone, Default)]
pub struct Sizes {
    pub python: usize,
    pub shell: usize,
    /// Native python sandboxes per image.
    pub images: BTreeMap<String, usize>,
    /// MicroVM clones per image.
    pub microvm: BTreeMap<String, usize>,
}

/// The policy of a sandbox of `kind` under the server's base `policy`: what a request of that
/// tier that names the image gets cold.
fn policy_of(policy: &Policy, kind: &Kind) -> Policy {
    let mut p = policy.clone();
    p.tier = kind.tier;
    if let Some(name) = &kind.image {
        p.filesystem.rootfs = None;
        p.filesystem.image = Some(name.clone());
    }
    p
}

/// The image a request's sandbox boots, as the engine resolves it: a microVM run that names
/// neither an image nor a root boots the tier's base image.
fn image_of(policy: &Policy) -> Option<String> {
    let fs = &policy.filesystem;
    match (policy.tier, &fs.image, &fs.rootfs) {
        (Tier::Microvm, None, None) => Some(BASE_IMAGE.into()),
        _ => fs.image.clone(),
    }
}

#[derive(Debug)]
pub struct Pool {
    ready: Mutex<HashMap<Kind, VecDeque<AgentSandbox>>>,
    sizes: HashMap<Kind, usize>,
    max_age: Duration,
    /// The longest timeout a run served from the pool may have.
    longest_run: Duration,
    /// The longest a session served from the pool may live; zero while it serves none.
    longest_session: Duration,
    engine: Arc<Engine>,
    policy: Policy,
    /// The pooled sandboxes' [`shape`] per tier and image (`None`: the host view), which
    /// every request is compared with.
    shapes: HashMap<(Tier, Option<String>), Policy>,
    wake: Notify,
}

impl Pool {
    /// A pool of sandboxes made under `policy`: `python` and `shell` ones on the host view,
    /// `images[name]` python ones on each image and `microvm[name]` clones of each image, with
    /// the image's preloads imported. `longest_run` is the longest timeout a request may ask
    /// for: a sandbox is kept alive long enough to serve it. Native sandboxes are made only
    /// when `policy` is of the native tier.
    pub fn new(
        engine: Arc<Engine>,
        policy: Policy,
        sizes: &Sizes,
        max_age: Duration,
        longest_run: Duration,
    ) -> Pool {
        let native = policy.tier == Tier::Native;
        let mut counts = HashMap::from([
            (Kind::host(Profile::Python), sizes.python),
            (Kind::host(Profile::Shell), sizes.shell),
        ]);
        counts.extend(sizes.images.iter().map(|(n, &c)| (Kind::image(n), c)));
        if !native {
            counts.clear();
        }
        counts.extend(sizes.microvm.iter().map(|(n, &c)| (Kind::clone_of(n), c)));
        let shapes = counts
            .keys()
            .map(|k| ((k.tier, k.image.clone()), shape(&policy_of(&policy, k))))
            .collect();
        Pool {
            ready: Mutex::new(HashMap::new()),
            sizes: counts,
            max_age,
            longest_run: longest_run.max(policy.limits.timeout.0),
            longest_session: Duration::ZERO,
            engine,
            shapes,
            policy,
            wake: Notify::new(),
        }
    }

    /// The kind whose pooled sandboxes are exactly the sandbox `req` would get cold, if any: a
    /// code run, in a pooled tier, whose whole policy (its image included) has the pool's
    /// [`shape`], with a timeout a pooled sandbox lives long enough to serve. Which image
    /// digest a name means is checked when a sandbox is taken.
    pub fn serves(&self, req: &RunRequest) -> Option<Kind> {
        let Command::Code { language, .. } = &req.command else {
            return None;
        };
        let fits = req.policy.limits.timeout.0 <= self.longest_run;
        fits.then(|| self.kind_of(&req.policy, Profile::of(*language)))
            .flatten()
    }

    /// Makes the pool's microVM clones live long enough to serve sessions that live at most
    /// `max_lifetime`, and lets [`Pool::serves_session`] hand them out.
    pub fn serving_sessions(mut self, max_lifetime: Duration) -> Pool {
        self.longest_session = max_lifetime;
        self
    }

    /// The kind whose pooled sandboxes are exactly the sandbox a session under `policy` would
    /// get cold, if any: microVM clones only (a cold microVM session boots a guest, a native
    /// one starts in milliseconds), of the session's image and [`shape`]. A session's agent
    /// runs python, as a clone's does.
    pub fn serves_session(&self, policy: &Policy) -> Option<Kind> {
        let fits = policy.tier == Tier::Microvm && !self.longest_session.is_zero();
        fits.then(|| self.kind_of(policy, Profile::Python))
            .flatten()
    }

    /// The pooled kind of `profile` whose sandboxes have `policy`'s shape, if one is pooled.
    fn kind_of(&self, policy: &Policy, profile: Profile) -> Option<Kind> {
        let tier = policy.tier;
        let image = image_of(policy);
        let mut policy = policy.clone();
        policy.filesystem.image.clone_from(&image);
        let fits = POOLED_TIERS.contains(&tier)
            && self.shapes.get(&(tier, image.clone())) == Some(&shape(&policy));
        fits.then_some(Kind {
            tier,
            profile,
            image,
        })
    }

    /// A ready sandbox, if one is warm; the refill starts another. A sandbox on an image is
    /// handed out only while the image's name still means the digest it was started on: a
    /// rebuilt image makes the older sandboxes stale.
    pub fn take(&self, kind: &Kind) -> Option<AgentSandbox> {
        let digest = kind
            .image
            .as_ref()
            .map(|name| self.engine.images.digest(name));
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        let queue = ready.entry(kind.clone()).or_default();
        let mut found = None;
        while let Some(sb) = queue.pop_front() {
            let current = digest
                .as_ref()
                .is_none_or(|d| d.is_some() && sb.image_digest() == *d);
            if current && !sb.has_ended() && sb.started.elapsed() < self.max_age {
                found = Some(sb);
                break;
            }
            tokio::spawn(async move { sb.close().await });
        }
        drop(ready);
        self.wake.notify_one();
        found
    }

    fn add(&self, kind: &Kind, sb: AgentSandbox) {
        self.ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind.clone())
            .or_default()
            .push_back(sb);
    }

    pub fn ready_count(&self, kind: &Kind) -> usize {
        self.ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(kind)
            .map_or(0, VecDeque::len)
    }

    /// Starts one sandbox of `kind`, its image's preloads imported before it is ready.
    async fn start(
        &self,
        kind: &Kind,
        lifetime: Duration,
    ) -> Result<AgentSandbox, kennel_sandbox::Error> {
        let preload = match &kind.image {
            Some(name) => self.engine.images.resolve(name)?.record.preload,
            None => vec![],
        };
        let policy = policy_of(&self.policy, kind);
        AgentSandbox::start(self.engine.clone(), policy, lifetime, &preload).await
    }

    /// Keeps every profile filled until shutdown; old or dead sandboxes are replaced.
    pub async fn refill(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        // A sandbox must outlive its stay in the pool plus the longest run or session it may
        // serve.
        let serves = self.longest_run.max(self.longest_session);
        let lifetime = self.max_age + serves + Duration::from_secs(10);
        // Starts under way, per kind: each replacement starts the moment a sandbox is taken,
        // not when the starts before it are done (a preloaded start takes a second; waiting
        // for a batch would cap the refill at one sandbox a second).
        let mut starting: tokio::task::JoinSet<(
            Kind,
            Result<AgentSandbox, kennel_sandbox::Error>,
        )> = tokio::task::JoinSet::new();
        let mut in_flight: HashMap<Kind, usize> = HashMap::new();
        let mut backoff: HashMap<Kind, tokio::time::Instant> = HashMap::new();
        while !*shutdown.borrow() {
            let now = tokio::time::Instant::now();
            for (kind, &size) in &self.sizes {
                self.prune(kind);
                if backoff.get(kind).is_some_and(|until| *until > now) {
                    continue;
                }
                let flying = in_flight.entry(kind.clone()).or_default();
                let missing = size
                    .saturating_sub(self.ready_count(kind) + *flying)
                    .min(REFILL_BATCH.saturating_sub(*flying));
                for _ in 0..missing {
                    *flying += 1;
                    let (pool, kind) = (self.clone(), kind.clone());
                    starting.spawn(async move {
                        let started = pool.start(&kind, lifetime).await;
                        (kind, started)
                    });
                }
            }
            tokio::select! {
                Some(done) = starting.join_next() => {
                    let Ok((kind, started)) = done else { continue };
                    if let Some(n) = in_flight.get_mut(&kind) {
                        *n = n.saturating_sub(1);
                    }
                    match started {
                        Ok(sb) => self.add(&kind, sb),
                        Err(e) => {
                            // A start that fails (a missing image, limits too small) is tried
                            // again a second later, not in a busy loop.
                            tracing::warn!("cannot pre-start a {kind:?} sandbox: {e}");
                            backoff.insert(kind, tokio::time::Instant::now() + Duration::from_secs(1));
                        }
                    }
                }
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.changed() => {}
            }
        }
        // Starts still under way end as sandboxes that are closed at once.
        while let Some(done) = starting.join_next().await {
            if let Ok((_, Ok(sb))) = done {
                sb.close().await;
            }
        }
        self.drain().await;
    }

    fn prune(&self, kind: &Kind) {
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        let queue = ready.entry(kind.clone()).or_default();
        let (keep, stale): (VecDeque<_>, VecDeque<_>) = queue
            .drain(..)
            .partition(|sb| !sb.has_ended() && sb.started.elapsed() < self.max_age);
        *queue = keep;
        for sb in stale {
            tokio::spawn(async move { sb.close().await });
        }
    }

    /// Ends every pooled sandbox.
    pub async fn drain(&self) {
        let all: Vec<AgentSandbox> = {
            let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
            ready.values_mut().flat_map(|q| q.drain(..)).collect()
        };
        for sb in all {
            sb.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kennel_types::api::RunRequest;
    use kennel_types::policy::Span;
    use serde_json::{json, Value};

    /// Every leaf of a serialized policy, with another value and whether it shapes the
    /// sandbox (`false`: the agent applies it per run). A field added to the policy that is
    /// missing here fails `every_policy_field_is_considered`.
    fn changes() -> Vec<(&'static str, Value, bool)> {
        vec![
            ("tier", json!("oci"), true),
            ("oci.runtime", json!("crun"), true),
            ("oci.platform", json!("ptrace"), true),
            ("oci.docker_image", json!("python:3.11"), true),
            ("microvm.require_kvm", json!(true), true),
            ("limits.timeout", json!("5s"), false),
            ("limits.output", json!("1K"), false),
            ("limits.collect_size", json!("1K"), false),
            ("limits.memory", json!("256M"), true),
            ("limits.cpus", json!(0.5), true),
            ("limits.pids", json!(64), true),
            ("limits.tmp_size", json!("16M"), true),
            ("limits.workspace_size", json!("16M"), true),
            ("limits.open_files", json!(64), true),
            ("filesystem.rootfs", json!("/srv/root"), true),
            ("filesystem.image", json!("python-data"), true),
            ("network.mode", json!("full"), true),
            ("network.allow", json!(["example.com"]), true),
            ("network.resolve", json!(["example.com:192.0.2.1"]), true),
            ("layers.landlock", json!("best_effort"), true),
            ("layers.cgroups", json!("required"), true),
            // The filter and its watcher start with the sandbox.
            ("layers.watch", json!(false), true),
            ("layers.exec_log", json!(false), true),
            ("on_violation", json!("kill"), true),
            ("tripwires", json!(["ptrace"]), true),
            ("capabilities", json!("none"), true),
            ("env", json!({"A": "b"}), true),
        ]
    }

    fn leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(m) if !m.is_empty() && prefix != "env" => {
                for (k, v) in m {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    leaves(v, &path, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }

    fn changed(path: &str, value: &Value) -> Policy {
        let mut v = serde_json::to_value(Policy::default()).unwrap();
        let pointer = format!("/{}", path.replace('.', "/"));
        *v.pointer_mut(&pointer).unwrap() = value.clone();
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{path} = {value}: {e}"))
    }

    #[test]
    fn every_policy_field_is_considered() {
        let mut found = vec![];
        leaves(
            &serde_json::to_value(Policy::default()).unwrap(),
            "",
            &mut found,
        );
        let mut listed: Vec<String> = changes().iter().map(|c| c.0.to_string()).collect();
        found.sort();
        listed.sort();
        assert_eq!(
            found, listed,
            "the policy's fields changed: sort each new one into shape() and changes()"
        );
        for (path, value, shapes) in changes() {
            let policy = changed(path, &value);
            assert_ne!(
                policy,
                Policy::default(),
                "{path} = {value} changes nothing"
            );
            assert_eq!(
                shape(&policy) != shape(&Policy::default()),
                shapes,
                "{path} = {value}: shapes the sandbox is {shapes}"
            );
        }
    }

    fn pool(policy: Policy) -> Pool {
        let engine = Arc::new(Engine::with_helper("/nonexistent".into()));
        let hour = Duration::from_secs(3600);
        let sizes = Sizes {
            python: 1,
            shell: 1,
            ..Sizes::default()
        };
        Pool::new(engine, policy, &sizes, Duration::from_secs(60), hour)
    }

    #[test]
    fn an_image_is_served_only_by_its_own_sandboxes() {
        let engine = Arc::new(Engine::with_helper("/nonexistent".into()));
        let sizes = Sizes {
            python: 1,
            images: BTreeMap::from([("python-data".to_string(), 1)]),
            microvm: BTreeMap::from([("python-data".to_string(), 1), (BASE_IMAGE.to_string(), 1)]),
            ..Sizes::default()
        };
        let minute = Duration::from_secs(60);
        let pool = Pool::new(engine, Policy::default(), &sizes, minute, minute);
        let on = |name: &str| {
            let mut p = Policy::default();
            p.filesystem.image = Some(name.into());
            p
        };
        assert_eq!(
            pool.serves(&code_run(on("python-data"))),
            Some(Kind::image("python-data"))
        );
        assert_eq!(
            pool.serves(&code_run(on("other"))),
            None,
            "an image not pooled"
        );
        let mut bigger = on("python-data");
        bigger.limits.memory = kennel_types::policy::ByteSize(1 << 30);
        assert_eq!(
            pool.serves(&code_run(bigger)),
            None,
            "the image, but another shape"
        );
        assert_eq!(
            pool.serves(&code_run(Policy::default())),
            Some(Kind::host(Profile::Python)),
            "the host view is still served by its own"
        );
        // The tier is part of the kind: a microVM run of an image is served by its clones,
        // and one naming no image by the base image's, which is what it would boot cold.
        let vm = |p: Policy| Policy {
            tier: Tier::Microvm,
            ..p
        };
        assert_eq!(
            pool.serves(&code_run(vm(on("python-data")))),
            Some(Kind::clone_of("python-data"))
        );
        assert_eq!(
            pool.serves(&code_run(vm(Policy::default()))),
            Some(Kind::clone_of(BASE_IMAGE))
        );
        let mut kvm = vm(on("python-data"));
        kvm.microvm.require_kvm = true;
        assert_eq!(
            pool.serves(&code_run(kvm)),
            None,
            "a guest that must be KVM"
        );
        let mut rooted = vm(Policy::default());
        rooted.filesystem.rootfs = Some("/srv/root".into());
        assert_eq!(
            pool.serves(&code_run(rooted)),
            None,
            "a microVM of another root"
        );
    }

    #[test]
    fn a_session_is_served_only_by_a_clone_of_its_shape() {
        let engine = Arc::new(Engine::with_helper("/nonexistent".into()));
        let sizes = Sizes {
            python: 1,
            microvm: BTreeMap::from([(BASE_IMAGE.to_string(), 1)]),
            ..Sizes::default()
        };
        let minute = Duration::from_secs(60);
        let vm = Policy {
            tier: Tier::Microvm,
            ..Policy::default()
        };
        let plain = Pool::new(engine.clone(), Policy::default(), &sizes, minute, minute);
        assert_eq!(plain.serves_session(&vm), None, "not serving sessions");
        let pool = Pool::new(engine, Policy::default(), &sizes, minute, minute)
            .serving_sessions(Duration::from_secs(3600));
        assert_eq!(pool.serves_session(&vm), Some(Kind::clone_of(BASE_IMAGE)));
        assert_eq!(
            pool.serves_session(&Policy::default()),
            None,
            "native sessions start cold"
        );
        let mut bigger = vm.clone();
        bigger.limits.memory = kennel_types::policy::ByteSize(1 << 30);
        assert_eq!(pool.serves_session(&bigger), None, "another shape");
        let mut other = vm.clone();
        other.env.insert("X".into(), "1".into());
        assert_eq!(pool.serves_session(&other), None, "another environment");
        // The per-exec default timeout is applied by the agent, not the sandbox.
        let mut slow = vm;
        slow.limits.timeout = kennel_types::policy::Span(Duration::from_secs(600));
        assert_eq!(pool.serves_session(&slow), Some(Kind::clone_of(BASE_IMAGE)));
    }

    #[test]
    fn a_pool_of_a_tier_above_native_starts_only_its_clones() {
        let engine = Arc::new(Engine::with_helper("/nonexistent".into()));
        let oci = Policy {
            tier: Tier::Oci,
            ..Policy::default()
        };
        let sizes = Sizes {
            python: 2,
            images: BTreeMap::from([("python-data".to_string(), 1)]),
            microvm: BTreeMap::from([("python-data".to_string(), 3)]),
            ..Sizes::default()
        };
        let minute = Duration::from_secs(60);
        let pool = Pool::new(engine, oci, &sizes, minute, minute);
        let started: Vec<_> = pool.sizes.iter().filter(|(_, &n)| n > 0).collect();
        assert_eq!(started, [(&Kind::clone_of("python-data"), &3)]);
    }

    fn code_run(policy: Policy) -> RunRequest {
        RunRequest {
            policy,
            ..RunRequest::new(Command::Code {
                language: Language::Python,
                code: "print(1)".into(),
            })
        }
    }

    #[test]
    fn only_a_run_whose_sandbox_would_be_the_same_is_served_warm() {
        let pool = pool(Policy::default());
        let served = |p: Policy| pool.serves(&code_run(p));
        let python = Some(Kind::host(Profile::Python));
        assert_eq!(served(Policy::default()), python);
        for (path, value, shapes) in changes() {
            let expect = if shapes { None } else { python.clone() };
            assert_eq!(served(changed(path, &value)), expect, "{path} = {value}");
        }
        let argv = RunRequest::new(Command::Argv(vec!["/bin/true".into()]));
        assert_eq!(pool.serves(&argv), None, "argv runs are not pooled");
        let mut long = Policy::default();
        long.limits.timeout = Span(Duration::from_secs(7200));
        assert_eq!(served(long), None, "a timeout the sandbox cannot outlive");
    }

    #[test]
    fn a_pool_of_a_tier_that_is_not_pooled_starts_nothing() {
        let oci = Policy {
            tier: Tier::Oci,
            ..Policy::default()
        };
        let pool = pool(oci.clone());
        assert!(pool.sizes.values().all(|&n| n == 0));
        assert_eq!(pool.serves(&code_run(oci)), None);
    }
}
