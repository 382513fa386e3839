//! Reads several of a sidecar's tasks send alike (the same key, the same directory, the same
//! version of the job's tasks), fetched from the ensemble once for all of them.
//!
//! Every process of a JAX job waits on the same keys (the topology every process publishes, the
//! ids process 0 hands out), tasks that watch the job's tasks watch the same versions
//! (WatchTasks, read as the version it names: see `xla`), and TensorFlow's tasks read the same
//! directories: with one call per
//! task, a host's tasks park the same wait on the leader once each and carry the same answer back
//! once each. So the proxy sends one call per distinct read (the method and the request's bytes)
//! and hands its answer to every task that sent that read.
//!
//! No answer is older than its read: a read that comes while the same read is on its way does not
//! take that call's answer (it may have been decided before the read came) but goes, with every
//! other read that came meanwhile, in the next call, sent when this one returns. So a burst of
//! alike reads costs two calls, and each task's answer is one its own call could have had.
//!
//! The calls run in a task of their own, so one task giving up its read (its deadline passed)
//! does not end the call the others wait on; a call whose tasks have all given up is dropped,
//! as their own calls would have been.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tonic::Status;

/// An answer as every task that sent the read gets it (each downcasts and clones its copy).
type Shared = Result<Arc<dyn Any + Send + Sync>, Status>;

/// A read: the method and the request's encoded bytes.
type Read = (&'static str, Vec<u8>);

/// The reads one proxy shares between its tasks.
#[derive(Default)]
pub struct SharedReads {
    /// Each read with a call on its way: the tasks that came since, for the next call.
    next: Mutex<HashMap<Read, Vec<oneshot::Sender<Shared>>>>,
}

impl SharedReads {
    /// `req` of `method` as `send(req)` answers it, with one call for every task that sends the
    /// same read meanwhile (see the module doc).
    pub async fn read<Req, Resp, F, Fut>(
        self: &Arc<Self>,
        method: &'static str,
        req: Req,
        send: F,
    ) -> Result<Resp, Status>
    where
        Req: prost::Message + Clone + Send + 'static,
        Resp: Clone + Send + Sync + 'static,
        F: Fn(Req) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send,
    {
        let read = (method, req.encode_to_vec());
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut next = self.lock();
            match next.get_mut(&read) {
                Some(waiting) => {
                    waiting.push(tx);
                    false
                }
                None => {
                    next.insert(read.clone(), vec![tx]);
                    true
                }
            }
        };
        if start {
            let this = self.clone();
            tokio::spawn(async move { this.send_while_waited(read, req, send).await });
        }
        let shared = rx
            .await
            .map_err(|_| Status::internal(format!("{method}: the proxy's shared read ended")))?;
        shared.and_then(|any| {
            any.downcast_ref::<Resp>().cloned().ok_or_else(|| {
                Status::internal(format!(
                    "{method}: the proxy's shared read has another type"
                ))
            })
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Read, Vec<oneshot::Sender<Shared>>>> {
        self.next.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `read` while tasks wait for it: each call answers the tasks that came before it was
    /// sent.
    async fn send_while_waited<Req, Resp, F, Fut>(&self, read: Read, req: Req, send: F)
    where
        Req: prost::Message + Clone,
        Resp: Send + Sync + 'static,
        F: Fn(Req) -> Fut,
        Fut: Future<Output = Result<Resp, Status>>,
    {
        loop {
            let mut waiting = {
                let mut next = self.lock();
                let Some(waiting) = next.get_mut(&read) else {
                    return;
                };
                if waiting.is_empty() {
                    next.remove(&read);
                    return;
                }
                std::mem::take(waiting)
            };
            let call = send(req.clone());
            let all_gave_up = futures::future::join_all(waiting.iter_mut().map(|tx| tx.closed()));
            let answer: Shared = tokio::select! {
                answer = call => answer.map(|a| Arc::new(a) as Arc<dyn Any + Send + Sync>),
                _ = all_gave_up => continue,
            };
            for tx in waiting {
                let _ = tx.send(answer.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_proto::tensorflow::GetKeyValueRequest;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::sync::Semaphore;

    fn get(key: &str) -> GetKeyValueRequest {
        GetKeyValueRequest { key: key.into() }
    }

    /// A fake ensemble: each call takes a permit to answer (the test releases them) and answers
    /// the key with the number of calls so far.
    struct Fake {
        answers: Arc<Semaphore>,
        calls: Arc<AtomicU64>,
    }

    impl Fake {
        fn new() -> Fake {
            Fake {
                answers: Arc::new(Semaphore::new(0)),
                calls: Arc::new(AtomicU64::new(0)),
            }
        }

        fn send(
            &self,
        ) -> impl Fn(GetKeyValueRequest) -> futures::future::BoxFuture<'static, Result<String, Status>>
               + Send
               + 'static {
            let (answers, calls) = (self.answers.clone(), self.calls.clone());
            move |req| {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                let answers = answers.clone();
                Box::pin(async move {
                    let permit = answers.acquire().await.expect("open");
                    permit.forget();
                    Ok(format!("{}#{n}", req.key))
                })
            }
        }
    }

    async fn until(what: &str, cond: impl Fn() -> bool) {
        for _ in 0..500 {
            if cond() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        panic!("never: {what}");
    }

    #[tokio::test]
    async fn alike_reads_share_a_call_and_none_takes_an_answer_older_than_itself() {
        let reads = Arc::new(SharedReads::default());
        let fake = Fake::new();
        let read = |key: &'static str| {
            let (reads, send) = (reads.clone(), fake.send());
            tokio::spawn(async move { reads.read("GetKeyValue", get(key), send).await })
        };
        let first = read("a");
        until("the first call sent", || {
            fake.calls.load(Ordering::SeqCst) == 1
        })
        .await;
        // Three more come while it is on its way, and one of another key.
        let later: Vec<_> = (0..3).map(|_| read("a")).collect();
        let other = read("b");
        until("the other key's call sent", || {
            fake.calls.load(Ordering::SeqCst) == 2
        })
        .await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            fake.calls.load(Ordering::SeqCst),
            2,
            "the later alike reads wait for the next call"
        );
        fake.answers.add_permits(2);
        assert_eq!(first.await.expect("join").expect("read"), "a#1");
        assert_eq!(other.await.expect("join").expect("read"), "b#2");
        // The three went together in the next call, sent after the first returned.
        until("the next call sent", || {
            fake.calls.load(Ordering::SeqCst) == 3
        })
        .await;
        fake.answers.add_permits(1);
        for l in later {
            assert_eq!(l.await.expect("join").expect("read"), "a#3");
        }
        assert_eq!(fake.calls.load(Ordering::SeqCst), 3);
        assert!(reads.lock().is_empty(), "nothing left on its way");
    }

    #[tokio::test]
    async fn a_call_every_task_gave_up_is_dropped() {
        let reads = Arc::new(SharedReads::default());
        let fake = Fake::new();
        let (r, send) = (reads.clone(), fake.send());
        let gave_up = tokio::spawn(async move { r.read("GetKeyValue", get("a"), send).await });
        until("the call sent", || fake.calls.load(Ordering::SeqCst) == 1).await;
        gave_up.abort();
        until("the call dropped", || reads.lock().is_empty()).await;
        // A read that comes after is sent afresh.
        let (r, send) = (reads.clone(), fake.send());
        let again = tokio::spawn(async move { r.read("GetKeyValue", get("a"), send).await });
        until("sent afresh", || fake.calls.load(Ordering::SeqCst) == 2).await;
        fake.answers.add_permits(1);
        assert_eq!(again.await.expect("join").expect("read"), "a#2");
    }
}
