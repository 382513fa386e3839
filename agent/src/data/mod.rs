//! The tf.data data plane: the data worker and the consumer. The dispatcher itself (TensorFlow's
//! `DataServiceDispatcherImpl`) is served by the coordinator ensemble; workers and consumers talk
//! to it through any replica and to each other directly.
//!
//! - [`dispatcher`]: the dispatcher's RPCs with failover.
//! - [`task`]: one task on a worker: its producer and element queue.
//! - [`worker`]: the worker's element service and its heartbeat to the dispatcher.
//! - [`consumer`]: reads a job, round-robin included.

pub mod consumer;
pub mod dispatcher;
pub mod task;
pub mod worker;

pub use consumer::{Consumer, ConsumerOptions};
pub use dispatcher::DispatchClient;
pub use worker::DataWorkerService;
