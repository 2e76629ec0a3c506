//! The pipeline graph (in the spirit of CRACEN): stages joined by bounded rings, each stage
//! a pool of worker threads, each worker with its own input ring, or all of them taking from
//! one shared ring ([`Pipeline::shared_stage`]). A stage sends on its output ports; a port
//! chooses among the next stage's rings by its policy: round-robin, least-loaded (the
//! shortest ring) or broadcast (every worker gets a clone, available only for messages that
//! are cheap to clone, e.g. `Arc`). A full ring either blocks the sender (back-pressure,
//! counted) or drops the message (counted).
//!
//! A shared ring is for stages whose output is put back in order: its workers take messages
//! in the order sent, whenever one is free, so they finish at most about one message each
//! out of order. With a ring per worker, a message queued behind others on one worker
//! finishes after messages sent later to the others, and the stage downstream holds up to
//! `workers x capacity` of them to restore the order.
//!
//! Messages move by ownership (a `Box` of a pooled frame buffer is a pointer), never by
//! copying frame data. Every ring counts what it carried, how often a sender waited and
//! what it dropped; every stage counts its frames and the time its workers were busy.
//!
//! The graph ends when its sources are dropped: each worker drains its ring and exits,
//! which closes the rings it feeds.
//!
//! A worker that panics (a bug in its stage) stops, and the graph's [`Failure`] says which
//! and why: its sources look at it and stop feeding, since a stage downstream may wait for
//! the message that worker held (a reorder does) and never get it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

/// How a port picks the worker of the next stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    RoundRobin,
    LeastLoaded,
    Broadcast,
}

/// What a send does when the chosen ring is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenFull {
    /// Wait for room (back-pressure on everything upstream).
    Block,
    /// Drop the message.
    Drop,
}

/// Counters of one ring.
#[derive(Debug, Default)]
pub struct RingStats {
    pub sent: AtomicU64,
    /// Sends that found the ring full and waited.
    pub blocked: AtomicU64,
    /// Messages dropped because the ring was full.
    pub dropped: AtomicU64,
    /// Deepest the ring has been, in messages.
    pub high_water: AtomicU64,
}

/// Counters of one stage (all its workers).
#[derive(Debug)]
pub struct StageStats {
    pub name: String,
    pub workers: usize,
    pub capacity: usize,
    pub processed: AtomicU64,
    /// Nanoseconds the workers spent processing (not waiting for input).
    pub busy_ns: AtomicU64,
    /// Messages the stage's code discarded on purpose (e.g. vetoed frames).
    pub discarded: AtomicU64,
    pub rings: Vec<Arc<RingStats>>,
}

impl StageStats {
    pub fn blocked(&self) -> u64 {
        self.rings.iter().map(|r| r.blocked.load(Ordering::Relaxed)).sum()
    }
    pub fn dropped(&self) -> u64 {
        self.rings.iter().map(|r| r.dropped.load(Ordering::Relaxed)).sum()
    }
    pub fn high_water(&self) -> u64 {
        self.rings.iter().map(|r| r.high_water.load(Ordering::Relaxed)).max().unwrap_or(0)
    }
}

/// Whether a worker of the graph panicked, and the first one's stage, number and message.
#[derive(Debug, Default)]
pub struct Failure {
    failed: AtomicBool,
    first: Mutex<Option<String>>,
}

impl Failure {
    pub fn is_set(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// What the first worker that panicked said, naming its stage and number.
    pub fn first(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn record(&self, stage: &str, worker: usize, payload: &(dyn std::any::Any + Send)) {
        let said = payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str)).unwrap_or("no message");
        self.first.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(|| format!("worker {worker} of the {stage} stage panicked (a bug): {said}"));
        self.failed.store(true, Ordering::Release);
    }
}

/// A sending end: one sender per worker of the target stage, and the policy.
pub struct Port<M> {
    targets: Vec<(Sender<M>, Arc<RingStats>)>,
    policy: Policy,
    full: WhenFull,
    next: Arc<AtomicUsize>,
    share: Option<fn(&M) -> M>,
}

impl<M> Clone for Port<M> {
    fn clone(&self) -> Self {
        Port { targets: self.targets.clone(), policy: self.policy, full: self.full, next: self.next.clone(), share: self.share }
    }
}

impl<M> Port<M> {
    /// Sends `m`; false if it was dropped (ring full under [`WhenFull::Drop`], or the next
    /// stage is gone). Broadcast reports whether every worker got its copy.
    pub fn send(&self, m: M) -> bool {
        match self.policy {
            Policy::RoundRobin => {
                let i = self.next.fetch_add(1, Ordering::Relaxed) % self.targets.len();
                self.send_to(i, m)
            }
            Policy::LeastLoaded => {
                let i = (0..self.targets.len()).min_by_key(|&i| self.targets[i].0.len()).expect("a port has targets");
                if self.full == WhenFull::Block && self.targets[i].0.is_full() {
                    return self.send_to_first_free(m);
                }
                self.send_to(i, m)
            }
            Policy::Broadcast => {
                let share = self.share.expect("broadcast ports are built with a share function");
                let last = self.targets.len() - 1;
                let mut all = true;
                for i in 0..last {
                    all &= self.send_to(i, share(&m));
                }
                all & self.send_to(last, m)
            }
        }
    }

    /// Every ring is full: wait for whichever worker makes room first.
    fn send_to_first_free(&self, m: M) -> bool {
        let mut sel = crossbeam_channel::Select::new();
        for (tx, _) in &self.targets {
            sel.send(tx);
        }
        let op = sel.select();
        let i = op.index();
        let (tx, stats) = &self.targets[i];
        stats.blocked.fetch_add(1, Ordering::Relaxed);
        let ok = op.send(tx, m).is_ok();
        if ok {
            stats.sent.fetch_add(1, Ordering::Relaxed);
            stats.high_water.fetch_max(tx.len() as u64, Ordering::Relaxed);
        } else {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    fn send_to(&self, i: usize, m: M) -> bool {
        let (tx, stats) = &self.targets[i];
        let ok = match tx.try_send(m) {
            Ok(()) => true,
            Err(TrySendError::Full(m)) => match self.full {
                WhenFull::Block => {
                    stats.blocked.fetch_add(1, Ordering::Relaxed);
                    tx.send(m).is_ok()
                }
                WhenFull::Drop => false,
            },
            Err(TrySendError::Disconnected(_)) => false,
        };
        if ok {
            stats.sent.fetch_add(1, Ordering::Relaxed);
            stats.high_water.fetch_max(tx.len() as u64, Ordering::Relaxed);
        } else {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }
}

/// What a worker sees of the graph: its output ports, its stage's counters and its input.
pub struct Emit<M> {
    ports: Vec<Port<M>>,
    stats: Arc<StageStats>,
    input: Receiver<M>,
}

impl<M> Emit<M> {
    /// Sends on output port `port` (in the order the ports were connected).
    pub fn send(&self, port: usize, m: M) -> bool {
        self.ports[port].send(m)
    }

    /// Counts a message the stage discards on purpose.
    pub fn discard(&self) {
        self.stats.discarded.fetch_add(1, Ordering::Relaxed);
    }

    /// Messages waiting in the worker's input ring (its stage's, for a shared ring). The
    /// last message of a run sees none.
    pub fn queued(&self) -> usize {
        self.input.len()
    }
}

/// One worker of a stage: takes a message and emits what it makes of it.
pub type WorkerFn<'a, M> = Box<dyn FnMut(M, &Emit<M>) + Send + 'a>;

struct StageSpec<'a, M> {
    stats: Arc<StageStats>,
    inputs: Vec<(Sender<M>, Receiver<M>)>,
    workers: Vec<WorkerFn<'a, M>>,
    ports: Vec<Port<M>>,
}

/// A graph under construction.
pub struct Pipeline<'a, M> {
    stages: Vec<StageSpec<'a, M>>,
    failure: Arc<Failure>,
}

/// A stage, by index, for connecting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageId(usize);

impl<'a, M: Send + 'a> Default for Pipeline<'a, M> {
    fn default() -> Self {
        Pipeline { stages: Vec::new(), failure: Arc::default() }
    }
}

impl<'a, M: Send + 'a> Pipeline<'a, M> {
    /// Adds a stage of `workers` threads, each with an input ring of `capacity` messages;
    /// `make(k)` builds worker k's function (its own state and scratch buffers).
    pub fn stage(&mut self, name: &str, workers: usize, capacity: usize, make: impl FnMut(usize) -> WorkerFn<'a, M>) -> StageId {
        self.add_stage(name, workers, workers, capacity, make)
    }

    /// Adds a stage of `workers` threads that take from one shared ring of `capacity`
    /// messages, each whenever it is free (messages start in the order sent).
    pub fn shared_stage(&mut self, name: &str, workers: usize, capacity: usize, make: impl FnMut(usize) -> WorkerFn<'a, M>) -> StageId {
        self.add_stage(name, workers, 1, capacity, make)
    }

    fn add_stage(&mut self, name: &str, workers: usize, rings: usize, capacity: usize, mut make: impl FnMut(usize) -> WorkerFn<'a, M>) -> StageId {
        assert!(workers > 0 && capacity > 0, "a stage has workers and rings");
        let inputs: Vec<_> = (0..rings).map(|_| bounded(capacity)).collect();
        let rings = (0..rings).map(|_| Arc::new(RingStats::default())).collect();
        let stats = Arc::new(StageStats {
            name: name.to_string(),
            workers,
            capacity,
            processed: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            rings,
        });
        self.stages.push(StageSpec { stats, inputs, workers: (0..workers).map(&mut make).collect(), ports: Vec::new() });
        StageId(self.stages.len() - 1)
    }

    fn port(&self, to: StageId, policy: Policy, full: WhenFull, share: Option<fn(&M) -> M>) -> Port<M> {
        let t = &self.stages[to.0];
        let targets = t.inputs.iter().zip(&t.stats.rings).map(|((tx, _), s)| (tx.clone(), s.clone())).collect();
        Port { targets, policy, full, next: Arc::new(AtomicUsize::new(0)), share }
    }

    /// Connects `from`'s next output port to `to`; returns the port number. Broadcast
    /// needs [`Pipeline::connect_broadcast`].
    pub fn connect(&mut self, from: StageId, to: StageId, policy: Policy, full: WhenFull) -> usize {
        assert_ne!(policy, Policy::Broadcast, "broadcast needs connect_broadcast (messages must be shareable)");
        let p = self.port(to, policy, full, None);
        self.stages[from.0].ports.push(p);
        self.stages[from.0].ports.len() - 1
    }

    /// Connects with the broadcast policy: every worker of `to` gets `share(&m)`, the last
    /// one `m` itself.
    pub fn connect_broadcast(&mut self, from: StageId, to: StageId, full: WhenFull, share: fn(&M) -> M) -> usize {
        let p = self.port(to, Policy::Broadcast, full, Some(share));
        self.stages[from.0].ports.push(p);
        self.stages[from.0].ports.len() - 1
    }

    /// Whether a worker panicked, for the sources to look at as they feed.
    pub fn failure(&self) -> Arc<Failure> {
        self.failure.clone()
    }

    /// A port into `to` for a source outside the graph.
    pub fn source(&self, to: StageId, policy: Policy, full: WhenFull) -> Port<M> {
        assert_ne!(policy, Policy::Broadcast, "sources send to one worker");
        self.port(to, policy, full, None)
    }

    /// Starts every worker in scope `s`. The graph runs until its sources are dropped and
    /// its rings drained; join the handles (or leave the scope) to wait for it.
    pub fn spawn<'scope, 'env>(self, s: &'scope Scope<'scope, 'env>) -> Running<'scope>
    where
        'a: 'scope,
    {
        let mut threads = Vec::new();
        let mut stats = Vec::new();
        for spec in self.stages {
            stats.push(spec.stats.clone());
            let receivers: Vec<Receiver<M>> = spec.inputs.into_iter().map(|(_, rx)| rx).collect();
            // a shared ring's workers each hold a receiver of the one ring
            let ring_of = |k: usize| receivers[k % receivers.len()].clone();
            for (k, mut work) in spec.workers.into_iter().enumerate() {
                let rx = ring_of(k);
                let emit = Emit { ports: spec.ports.clone(), stats: spec.stats.clone(), input: rx.clone() };
                let st = spec.stats.clone();
                let failure = self.failure.clone();
                let name = format!("{}-{k}", st.name);
                let h = std::thread::Builder::new()
                    .name(name)
                    .spawn_scoped(s, move || {
                        for m in rx.iter() {
                            let t = Instant::now();
                            // the worker's state may be half changed: it takes nothing more
                            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| work(m, &emit))) {
                                failure.record(&st.name, k, payload.as_ref());
                                return;
                            }
                            st.busy_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                            st.processed.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                    .expect("spawning a pipeline worker");
                threads.push(h);
            }
        }
        Running { threads, stats }
    }
}

/// A running graph: its threads and the counters of every stage.
pub struct Running<'scope> {
    pub threads: Vec<ScopedJoinHandle<'scope, ()>>,
    pub stats: Vec<Arc<StageStats>>,
}

impl Running<'_> {
    /// Waits for every worker (one that panicked says so in the graph's [`Failure`]).
    pub fn join(self) -> Vec<Arc<StageStats>> {
        for t in self.threads {
            t.join().expect("a worker's panic is caught in its loop");
        }
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// source -> double (n workers, policy) -> collect (1 worker)
    fn run(workers: usize, policy: Policy, shared: bool, n: u64) -> (Vec<(usize, u64)>, Vec<Arc<StageStats>>) {
        let out = Mutex::new(Vec::new());
        let stats = std::thread::scope(|s| {
            let mut p: Pipeline<(usize, u64)> = Pipeline::default();
            let double = |k| -> WorkerFn<(usize, u64)> { Box::new(move |(_, v), e: &Emit<_>| {
                e.send(0, (k, v * 2));
            }) };
            let double = if shared { p.shared_stage("double", workers, 4, double) } else { p.stage("double", workers, 4, double) };
            let out = &out;
            let collect = p.stage("collect", 1, 4, |_| Box::new(move |m, _: &Emit<_>| out.lock().unwrap().push(m)));
            p.connect(double, collect, Policy::RoundRobin, WhenFull::Block);
            let src = p.source(double, policy, WhenFull::Block);
            let running = p.spawn(s);
            for v in 0..n {
                assert!(src.send((0, v)));
            }
            drop(src);
            running.join()
        });
        (out.into_inner().unwrap(), stats)
    }

    #[test]
    fn every_message_arrives_once_and_is_counted() {
        for (policy, shared) in [(Policy::RoundRobin, false), (Policy::LeastLoaded, false), (Policy::LeastLoaded, true)] {
            let (mut got, stats) = run(3, policy, shared, 1000);
            got.sort_by_key(|m| m.1);
            assert_eq!(got.iter().map(|m| m.1).collect::<Vec<_>>(), (0..1000).map(|v| v * 2).collect::<Vec<_>>());
            assert_eq!(stats[0].processed.load(Ordering::Relaxed), 1000);
            assert_eq!(stats[1].processed.load(Ordering::Relaxed), 1000);
            let sent: u64 = stats[0].rings.iter().map(|r| r.sent.load(Ordering::Relaxed)).sum();
            assert_eq!(sent, 1000);
            assert_eq!(stats[0].dropped(), 0);
            assert!(stats[0].high_water() <= 4);
        }
    }

    #[test]
    fn a_panicking_worker_stops_and_the_graph_says_which() {
        let out = Mutex::new(Vec::new());
        let (sent, failure, stats) = std::thread::scope(|s| {
            let mut p: Pipeline<u64> = Pipeline::default();
            let out = &out;
            let work = p.shared_stage("work", 2, 4, |_| Box::new(move |v, e: &Emit<_>| {
                assert_ne!(v, 10, "a bug met message {v}");
                e.send(0, v);
            }));
            let collect = p.stage("collect", 1, 4, |_| Box::new(move |m, _: &Emit<_>| out.lock().unwrap().push(m)));
            p.connect(work, collect, Policy::RoundRobin, WhenFull::Block);
            let src = p.source(work, Policy::LeastLoaded, WhenFull::Block);
            let failure = p.failure();
            let running = p.spawn(s);
            let mut sent = 0;
            while !failure.is_set() {
                assert!(src.send(sent), "the other worker still takes messages");
                sent += 1;
                assert!(sent < 10_000_000, "the failure is seen");
            }
            drop(src);
            (sent, failure, running.join())
        });
        let why = failure.first().expect("the panic is recorded");
        assert!(why.contains("of the work stage panicked") && why.contains("a bug met message 10"), "{why}");
        // the worker that panicked stopped; the other took the rest of the shared ring
        let mut got = out.into_inner().unwrap();
        got.sort_unstable();
        assert_eq!(got, (0..sent).filter(|&v| v != 10).collect::<Vec<_>>());
        assert_eq!(stats[0].processed.load(Ordering::Relaxed), sent - 1);
    }

    #[test]
    fn round_robin_spreads_evenly() {
        let (got, _) = run(4, Policy::RoundRobin, false, 400);
        for k in 0..4 {
            assert_eq!(got.iter().filter(|m| m.0 == k).count(), 100, "worker {k}");
        }
    }

    #[test]
    fn least_loaded_avoids_a_slow_worker() {
        let out = Mutex::new(vec![0u64; 2]);
        std::thread::scope(|s| {
            let mut p: Pipeline<u64> = Pipeline::default();
            let out = &out;
            let st = p.stage("work", 2, 2, |k| Box::new(move |_, _: &Emit<_>| {
                if k == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                out.lock().unwrap()[k] += 1;
            }));
            let src = p.source(st, Policy::LeastLoaded, WhenFull::Block);
            let running = p.spawn(s);
            for v in 0..200 {
                src.send(v);
            }
            drop(src);
            running.join();
        });
        let c = out.into_inner().unwrap();
        assert_eq!(c[0] + c[1], 200);
        assert!(c[1] > 3 * c[0], "the fast worker took most: {c:?}");
    }

    #[test]
    fn a_shared_ring_passes_a_stuck_worker_by() {
        let (release, stuck) = bounded::<()>(1);
        let done = AtomicU64::new(0);
        let stats = std::thread::scope(|s| {
            let mut p: Pipeline<u64> = Pipeline::default();
            let (done, stuck) = (&done, &stuck);
            let st = p.shared_stage("work", 2, 2, |_| Box::new(move |v, _: &Emit<_>| {
                if v == 0 {
                    stuck.recv().expect("released");
                }
                done.fetch_add(1, Ordering::Relaxed);
            }));
            let src = p.source(st, Policy::LeastLoaded, WhenFull::Block);
            let running = p.spawn(s);
            let sender = s.spawn(move || (0..=20).all(|v| src.send(v)));
            // message 0 holds one worker: the other takes every later one (with a ring each,
            // message 2 would wait behind message 0)
            let t = Instant::now();
            while done.load(Ordering::Relaxed) < 20 && t.elapsed() < std::time::Duration::from_secs(60) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let passed = done.load(Ordering::Relaxed);
            release.send(()).expect("the stuck worker waits");
            assert!(sender.join().expect("the sender ends"));
            assert_eq!(passed, 20, "messages 1..=20 taken while message 0 held a worker");
            running.join()
        });
        assert_eq!(stats[0].rings.len(), 1);
        assert_eq!(stats[0].processed.load(Ordering::Relaxed), 21);
        assert!(stats[0].high_water() <= 2);
    }

    #[test]
    fn broadcast_reaches_every_worker() {
        let out = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            let mut p: Pipeline<Arc<u64>> = Pipeline::default();
            let src_stage = p.stage("src", 1, 4, |_| Box::new(|m, e: &Emit<_>| {
                e.send(0, m);
            }));
            let out = &out;
            let sink = p.stage("sink", 3, 4, |k| Box::new(move |m: Arc<u64>, _: &Emit<_>| out.lock().unwrap().push((k, *m))));
            p.connect_broadcast(src_stage, sink, WhenFull::Block, |m| m.clone());
            let src = p.source(src_stage, Policy::RoundRobin, WhenFull::Block);
            let running = p.spawn(s);
            for v in 0..10 {
                src.send(Arc::new(v));
            }
            drop(src);
            running.join();
        });
        let got = out.into_inner().unwrap();
        assert_eq!(got.len(), 30);
        for k in 0..3 {
            assert_eq!(got.iter().filter(|m| m.0 == k).count(), 10);
        }
    }

    #[test]
    fn full_rings_block_or_drop_and_count_it() {
        let gate = std::sync::Barrier::new(2);
        let done = AtomicU64::new(0);
        let stats = std::thread::scope(|s| {
            let mut p: Pipeline<u64> = Pipeline::default();
            let (gate, done) = (&gate, &done);
            let slow = p.stage("slow", 1, 2, |_| Box::new(move |v, _: &Emit<_>| {
                if v == 0 {
                    gate.wait();
                }
                done.fetch_add(1, Ordering::Relaxed);
            }));
            let drop_src = p.source(slow, Policy::RoundRobin, WhenFull::Drop);
            let running = p.spawn(s);
            // the worker holds message 0 until the gate opens: the ring (2) fills, the rest drops
            drop_src.send(0);
            while drop_src.targets[0].0.len() > 0 {
                std::thread::yield_now();
            }
            let kept = (1..10).filter(|&v| drop_src.send(v)).count();
            assert_eq!(kept, 2);
            gate.wait();
            drop(drop_src);
            running.join()
        });
        assert_eq!(stats[0].dropped(), 7);
        assert_eq!(done.load(Ordering::Relaxed), 3);
        assert_eq!(stats[0].processed.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_worker_sees_what_waits_in_its_ring_and_the_last_message_sees_nothing() {
        let gate = std::sync::Barrier::new(2);
        let seen = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            let mut p: Pipeline<u64> = Pipeline::default();
            let (gate, seen) = (&gate, &seen);
            let stage = p.stage("look", 1, 8, |_| Box::new(move |v, e: &Emit<_>| {
                if v == 0 {
                    gate.wait();
                }
                seen.lock().expect("not poisoned").push((v, e.queued()));
            }));
            let src = p.source(stage, Policy::RoundRobin, WhenFull::Block);
            let running = p.spawn(s);
            // message 0 is taken and held at the gate while 1..=3 wait behind it
            src.send(0);
            while src.targets[0].0.len() > 0 {
                std::thread::yield_now();
            }
            (1..=3).for_each(|v| assert!(src.send(v)));
            gate.wait();
            drop(src);
            running.join()
        });
        assert_eq!(seen.into_inner().expect("not poisoned"), vec![(0, 3), (1, 2), (2, 1), (3, 0)]);
    }
}
