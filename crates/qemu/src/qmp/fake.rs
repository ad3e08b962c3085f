//! A scripted, recording [`Monitor`]: QEMU as a unit test sees it.
//!
//! Every command is recorded ([`Call`]: the command, its arguments, and the identity and mode of
//! an fd passed with it). Its answer comes from the script: the answers queued for that command
//! ([`Fake::reply`], [`Fake::refuse`], [`Fake::silence`]) in order, then `{}` — what QEMU
//! answers for a command without a return value, and what the parsers of this crate read as "no
//! entries" for a query. Events queued with [`Fake::emit_after`] go out right after their
//! command, as QEMU's `DEVICE_DELETED` follows `device_del`.
//!
//! A silenced command never answers: it fails with `Timeout` at its deadline, as the real client
//! does. Under tokio's paused time (`#[tokio::test(start_paused = true)]`) that costs no real
//! time.
//!
//! Compiled for this crate's tests and, with the `fake` cargo feature, for other crates' tests.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::{target_of, Event, Monitor, QmpError, Reply, DEFAULT_DEADLINE};

/// An fd passed with a command, as the fake saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassedFd {
    /// The file's device and inode: which file it is.
    pub dev: u64,
    pub ino: u64,
    /// Opened read-only (`O_RDONLY`).
    pub readonly: bool,
}

impl PassedFd {
    /// The identity and mode of `fd`.
    ///
    /// # Errors
    /// When `fd` cannot be inspected.
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<PassedFd> {
        let st = rustix::fs::fstat(fd)?;
        let flags = rustix::fs::fcntl_getfl(fd)?;
        let readonly = !flags.contains(rustix::fs::OFlags::RDWR) && !flags.contains(rustix::fs::OFlags::WRONLY);
        Ok(PassedFd { dev: st.st_dev, ino: st.st_ino, readonly })
    }
}

/// One command the fake received.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub command: String,
    pub args: Value,
    /// The fd sent with it (`execute_with_fd`), `None` when none was.
    pub fd: Option<PassedFd>,
}

/// A scripted answer.
#[derive(Clone, Debug)]
pub enum Answer {
    /// QMP's `return` value.
    Return(Value),
    /// A refusal with QMP's error class and description.
    Error { class: String, desc: String },
    /// No answer: the command times out at its deadline.
    Silent,
    /// `{}`, after the given time (a QEMU slow to answer).
    Late(Duration),
}

#[derive(Default)]
struct Script {
    calls: Vec<Call>,
    answers: HashMap<String, VecDeque<Answer>>,
    events_after: HashMap<String, VecDeque<(String, Value)>>,
    closed: bool,
}

/// A scripted, recording QMP connection. Share it (`Arc<Fake>` is a [`Monitor`]) to read the
/// calls after handing it to a [`Machine`](crate::Machine).
pub struct Fake {
    script: Mutex<Script>,
    events: broadcast::Sender<Event>,
}

impl Default for Fake {
    fn default() -> Fake {
        Fake { script: Mutex::default(), events: broadcast::channel(1024).0 }
    }
}

impl Fake {
    /// A fake that answers every command with `{}`.
    #[must_use]
    pub fn new() -> Fake {
        Fake::default()
    }

    fn script(&self) -> MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `answer` for the next unanswered call of `command`.
    pub fn answer(&self, command: &str, answer: Answer) -> &Fake {
        self.script().answers.entry(command.to_owned()).or_default().push_back(answer);
        self
    }

    /// Queues a `return` value for `command`.
    pub fn reply(&self, command: &str, value: Value) -> &Fake {
        self.answer(command, Answer::Return(value))
    }

    /// Queues a refusal of `command` with QMP's `class` and `desc`.
    pub fn refuse(&self, command: &str, class: &str, desc: &str) -> &Fake {
        self.answer(command, Answer::Error { class: class.to_owned(), desc: desc.to_owned() })
    }

    /// Queues no answer for `command`: it times out.
    pub fn silence(&self, command: &str) -> &Fake {
        self.answer(command, Answer::Silent)
    }

    /// Queues a late `{}` for `command`: it is answered `after` that long.
    pub fn delay(&self, command: &str, after: Duration) -> &Fake {
        self.answer(command, Answer::Late(after))
    }

    /// Sends event `name` with `data` right after the next call of `command` is answered.
    pub fn emit_after(&self, command: &str, name: &str, data: Value) -> &Fake {
        self.script().events_after.entry(command.to_owned()).or_default().push_back((name.to_owned(), data));
        self
    }

    /// Sends event `name` with `data` now.
    pub fn emit(&self, name: &str, data: Value) {
        let _ = self.events.send(Event { name: name.to_owned(), data, received: Instant::now() });
    }

    /// Every call so far.
    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        self.script().calls.clone()
    }

    /// The commands so far, by name.
    #[must_use]
    pub fn commands(&self) -> Vec<String> {
        self.script().calls.iter().map(|c| c.command.clone()).collect()
    }

    /// Records the call and takes its answer (and the events that follow it) from the script;
    /// `None` once closed.
    fn take(&self, command: &str, args: Value, fd: Option<PassedFd>) -> Option<(Answer, Vec<(String, Value)>)> {
        let mut s = self.script();
        s.calls.push(Call { command: command.to_owned(), args, fd });
        if s.closed {
            return None;
        }
        let answer = s.answers.get_mut(command).and_then(VecDeque::pop_front).unwrap_or(Answer::Return(json!({})));
        let events = s.events_after.get_mut(command).and_then(VecDeque::pop_front).into_iter().collect();
        Some((answer, events))
    }

    async fn run(&self, command: &str, args: Value, fd: Option<PassedFd>, deadline: Duration) -> Result<Value, QmpError> {
        let target = target_of(&args);
        let Some((answer, events)) = self.take(command, args, fd) else {
            return Err(QmpError::Disconnected { socket: self.socket().to_owned() });
        };
        let r = match answer {
            Answer::Return(v) => Ok(v),
            Answer::Error { class, desc } => Err(QmpError::Command { command: command.to_owned(), target, class, desc }),
            Answer::Silent => {
                tokio::time::sleep(deadline).await;
                return Err(QmpError::Timeout { command: command.to_owned(), deadline });
            }
            Answer::Late(after) => {
                tokio::time::sleep(after).await;
                Ok(json!({}))
            }
        };
        for (name, data) in events {
            self.emit(&name, data);
        }
        r
    }
}

impl Monitor for Fake {
    fn execute_within<'a>(&'a self, command: &'a str, args: Value, deadline: Duration) -> Reply<'a> {
        Box::pin(self.run(command, args, None, deadline))
    }

    fn execute_with_fd<'a>(&'a self, command: &'a str, args: Value, fd: BorrowedFd<'a>) -> Reply<'a> {
        // An fd that cannot be inspected is recorded as none: the test then fails on it.
        let passed = PassedFd::of(fd).ok();
        Box::pin(self.run(command, args, passed, DEFAULT_DEADLINE))
    }

    fn events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    fn close(&self) {
        self.script().closed = true;
        self.emit("DISCONNECTED", Value::Null);
    }

    fn socket(&self) -> &Path {
        Path::new("(fake QMP)")
    }
}
