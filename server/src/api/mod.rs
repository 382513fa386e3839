//! Wire adapters: one per surface. Each decodes its protocol, hands the call to the
//! [router](crate::serve::route) and encodes the answer; the semantics live in [`crate::serve`].
//!
//! - [`tf`]: `tensorflow.CoordinationService`, as TensorFlow's agents speak it.
//! - [`xla`]: `xla.coordination.CoordinationService`, as jaxlib speaks it, with its error details.
//! - [`kv`]: `coord.kv.KeyValue`: atomic increment and key watches.
//! - [`raw_kv`]: `coord.kv.RawKeys`: the raw key space (torch's store, through coord-proxy).
//! - [`coordination`]: `coord.coordination.Coordination`: error polling and task states for coord's
//!   own agent.
//! - [`dispatcher`]: `coord.dispatcher.Dispatcher`: coord's protocol of the tf.data dispatcher,
//!   and the whole dispatcher's operator views.
//! - [`tfdata`]: `tensorflow.data.DispatcherService`, as TensorFlow's tf.data workers and clients
//!   speak it, over the same dispatcher.
//! - [`admin`]: `coord.admin.Admin`: status, tasks, barriers, snapshots, membership.
//! - [`namespaces`]: `coord.admin.Namespaces`: declaring, deleting and listing namespaces.
//! - [`http`]: the HTTP port: health, readiness, status, metrics and the status page.
//! - [`wire`]: conversions between TensorFlow's wire types and the state machine's.
//! - [`oversized`]: a message over the size limit answers `RESOURCE_EXHAUSTED`.
//! - [`payloads`]: error details as TensorFlow's and XLA's clients read them.
//! - [`shared_answer`]: answers every task gets alike, sent from one buffer (gzipped once).
//! - [`relayed_waits`]: a follower's callers of one round waiting on the leader with one call.
//! - [`relayed_asks`]: a follower's callers' asks of one kind recorded on the leader together.
//! - [`relayed_reads`]: a follower's callers of one key-value read answered by one read.
//! - [`deferred`]: a call that waits answers after its headers, keeping only its own future.
//! - [`value_answers`]: large key-value answers many tasks read alike, encoded once.

/// Routes a call of `$self.router` as `$kind` under the name `$name` (its metrics label): `$local`
/// runs on the leader with `$self.core`, the message and its request id; a follower forwards it
/// with the `client` function in scope at the call. Defined before the modules, so in scope in all.
macro_rules! routed {
    ($self:ident, $req:ident, $name:literal, $kind:expr, $method:ident,
     |$core:ident, $m:pat_param, $id:pat_param| $local:expr) => {{
        let $core = &*$self.core;
        $self
            .router
            .route(
                $name,
                $kind,
                $req,
                |$m, $id| async move { $local },
                |ch, r| async move { client(ch).$method(r).await },
            )
            .await
    }};
}

pub mod admin;
pub mod backup;
pub mod coordination;
pub mod deferred;
pub mod dispatcher;
pub mod http;
pub mod kv;
pub mod namespaces;
pub mod numbered;
pub mod oversized;
pub mod payloads;
pub mod raw_kv;
pub mod relayed_asks;
pub mod relayed_reads;
pub mod relayed_waits;
pub mod rewrite;
pub mod shared_answer;
pub mod tf;
pub mod tfdata;
pub mod value_answers;
pub mod wire;
pub mod xla;
