//! The server's worker pool: threads that execute NBD requests for every
//! connection of a server.
//!
//! Owns: a FIFO of tasks and up to `workers_max` threads. Threads start on
//! demand — only when a task finds no idle worker — and leave after
//! `WORKER_IDLE` without work, so an idle server holds no worker at all.
//!
//! Invariants: every submitted task runs exactly once (if no thread can be
//! started and none is live, it runs on the submitter's thread); a task that
//! panics ends only itself, its worker goes on (the panic is counted).
//!
//! Why one pool per server rather than workers per connection: a connection
//! then costs one thread (its reader) however busy it was, and the server's
//! thread count is bounded by `connections + workers_max`. Each Linux thread
//! costs about four memory maps (stack, guard, signal stack, guard), and
//! `vm.max_map_count` (65,530 by default) capped per-connection workers at
//! under 8,000 busy connections.

use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// One unit of work (a request and its reply).
pub(crate) type Task = Box<dyn FnOnce() + Send + 'static>;

/// How long a worker waits for a task before it ends.
const WORKER_IDLE: Duration = Duration::from_secs(2);
/// Stack of a worker: a volume call and a reply, no recursion.
const WORKER_STACK_BYTES: usize = 512 << 10;

pub(crate) struct WorkerPool {
    state: Mutex<PoolState>,
    ready: Condvar,
    workers_max: usize,
    /// Tasks that panicked (a bug in a volume; the connection sees no reply).
    pub(crate) panics: AtomicU64,
}

struct PoolState {
    tasks: VecDeque<Task>,
    /// Workers waiting for a task.
    idle: usize,
    /// Workers started and not yet returned.
    live: usize,
}

impl WorkerPool {
    pub(crate) fn new(workers_max: usize) -> Arc<WorkerPool> {
        Arc::new(WorkerPool {
            state: Mutex::new(PoolState { tasks: VecDeque::new(), idle: 0, live: 0 }),
            ready: Condvar::new(),
            workers_max: workers_max.max(1),
            panics: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `task`, starting a worker for it if none is idle and fewer
    /// than `workers_max` live.
    pub(crate) fn submit(self: &Arc<Self>, task: Task) {
        let start = {
            let mut st = self.lock();
            st.tasks.push_back(task);
            if st.idle >= st.tasks.len() {
                self.ready.notify_one();
                false
            } else if st.live < self.workers_max {
                st.live += 1;
                true
            } else {
                false
            }
        };
        if !start {
            return;
        }
        let pool = self.clone();
        let spawned = std::thread::Builder::new()
            .name("nbd-worker".into())
            .stack_size(WORKER_STACK_BYTES)
            .spawn(move || pool.work());
        if spawned.is_err() {
            let orphan = {
                let mut st = self.lock();
                st.live -= 1;
                if st.live == 0 {
                    st.tasks.pop_front()
                } else {
                    None
                }
            };
            // No thread could be started and none is left to run the queue:
            // run one task here rather than leave it (and its reply) behind.
            if let Some(task) = orphan {
                self.run(task);
            }
        }
    }

    /// Workers live now.
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.lock().live
    }

    fn run(&self, task: Task) {
        if panic::catch_unwind(AssertUnwindSafe(task)).is_err() {
            self.panics.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A worker's life: run tasks until none came for `WORKER_IDLE`.
    fn work(&self) {
        let mut st = self.lock();
        loop {
            if let Some(task) = st.tasks.pop_front() {
                drop(st);
                self.run(task);
                st = self.lock();
                continue;
            }
            st.idle += 1;
            let (g, timeout) = self.ready.wait_timeout(st, WORKER_IDLE).unwrap_or_else(PoisonError::into_inner);
            st = g;
            st.idle -= 1;
            if timeout.timed_out() && st.tasks.is_empty() {
                break;
            }
        }
        st.live -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn every_task_runs_once_and_workers_stay_bounded() {
        let pool = WorkerPool::new(3);
        let (tx, rx) = mpsc::channel();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        for i in 0..50u32 {
            let (tx, gate) = (tx.clone(), gate.clone());
            pool.submit(Box::new(move || {
                let (m, c) = &*gate;
                let mut open = m.lock().unwrap();
                while !*open {
                    open = c.wait(open).unwrap();
                }
                tx.send(i).unwrap();
            }));
            assert!(pool.live() <= 3);
        }
        assert_eq!(pool.live(), 3);
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        let mut got: Vec<u32> = (0..50).map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn a_panicking_task_is_counted_and_the_pool_goes_on() {
        let pool = WorkerPool::new(1);
        pool.submit(Box::new(|| panic!("a volume bug")));
        let (tx, rx) = mpsc::channel();
        pool.submit(Box::new(move || tx.send(7).unwrap()));
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 7);
        assert_eq!(pool.panics.load(Ordering::Relaxed), 1);
    }
}
