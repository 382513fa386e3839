//! The namespace a call acts in, bound once where the call enters the ensemble.
//!
//! [`Router::route`](crate::serve::route::Router::route) resolves it from the connection (the
//! task certificate's namespace over TLS, else the `coord-namespace` header that coord-proxy
//! `--namespace` and coordctl `-n` send) and runs the whole call inside [`within`]. Everything
//! below acts in that namespace without being told: [`Proposer::propose`] wraps each command in
//! `Op::InNamespace` ([`bind`]), [`NsReader`] reads the namespace's records, parked calls and
//! heartbeats are keyed by [`current`]. So no layer can forget the namespace, and no field a
//! client fills can choose it.
//!
//! The binding is a tokio task-local: it follows the call's future, not spawned tasks. Leader
//! duties that run in tasks of their own (heartbeat checks, barrier deadlines) name the namespace
//! explicitly ([`bind_to`]).
//!
//! [`Proposer::propose`]: crate::serve::proposer::Proposer::propose

use std::future::Future;
use std::sync::{Arc, LazyLock};

use coord_raft_store::state::{name_problem, Space, DEFAULT_NAMESPACE};
use coord_raft_store::storage::{Applied, StateReader};
use coord_raft_store::{Command, Op};
use tonic::Status;

/// A namespace: `None` is the default one (the replicas' own job).
pub type Ns = Option<Arc<str>>;

tokio::task_local! {
    static BOUND: Ns;
}

/// The namespace the running call is bound to (the default one outside any call).
pub fn current() -> Ns {
    BOUND.try_with(Clone::clone).unwrap_or(None)
}

/// Runs `f` bound to namespace `ns`. Not an `async fn`: that would hold `f` twice (its argument
/// and the scope's copy), and a parked call pays for every byte of its future.
pub fn within<F: Future>(ns: Ns, f: F) -> impl Future<Output = F::Output> {
    BOUND.scope(ns, f)
}

/// The namespace a header value names: `default` (or no value) is the default one.
pub fn parse(value: Option<&str>) -> Result<Ns, Status> {
    match value {
        None | Some(DEFAULT_NAMESPACE) => Ok(None),
        Some(name) => match name_problem(name) {
            Some(problem) => Err(Status::invalid_argument(problem)),
            None => Ok(Some(Arc::from(name))),
        },
    }
}

/// How `ns` reads in messages.
pub fn shown(ns: &Ns) -> &str {
    ns.as_deref().unwrap_or(DEFAULT_NAMESPACE)
}

/// `op` made to act in `ns`.
pub fn bind_to(ns: &Ns, op: Op) -> Op {
    match ns {
        Some(name) if !matches!(op, Op::InNamespace { .. }) => Op::InNamespace {
            namespace: name.to_string(),
            op: Box::new(op),
        },
        _ => op,
    }
}

/// `command` made to act in the current namespace.
pub fn bind(command: Command) -> Command {
    match current() {
        None => command,
        ns => Command {
            request: command.request,
            op: bind_to(&ns, command.op),
        },
    }
}

/// What a namespace that does not exist reads as: nothing (its writes are refused NOT_FOUND).
static EMPTY: LazyLock<Space> = LazyLock::new(Space::default);

/// `ns`'s records in `applied` (a namespace that does not exist reads as empty).
pub fn space_of<'a>(applied: &'a Applied, ns: &Ns) -> &'a Space {
    applied.state.space(ns.as_deref()).unwrap_or(&EMPTY)
}

/// Every namespace of `applied` with its records, the default one first.
pub fn spaces(applied: &Applied) -> impl Iterator<Item = (Ns, &Space)> {
    applied
        .state
        .spaces()
        .map(|(name, s)| (name.map(Arc::from), s))
}

/// Whether `ns` exists.
pub fn exists(applied: &Applied, ns: &Ns) -> bool {
    applied.state.space(ns.as_deref()).is_some()
}

/// One namespace's view of the applied state, as [`NsReader::read`] hands it out.
pub struct View<'a> {
    /// The namespace's records.
    pub state: &'a Space,
    /// The whole applied state (log position, membership).
    pub applied: &'a Applied,
}

/// Reads the applied state as the current namespace sees it.
#[derive(Clone)]
pub struct NsReader(pub StateReader);

impl NsReader {
    /// Runs `f` on the current namespace's records. Keep `f` short: apply waits while it runs.
    pub fn read<R>(&self, f: impl FnOnce(View<'_>) -> R) -> R {
        let ns = current();
        self.0.read(|applied| {
            f(View {
                state: space_of(applied, &ns),
                applied,
            })
        })
    }

    /// The whole state, across namespaces.
    pub fn all(&self) -> &StateReader {
        &self.0
    }
}
