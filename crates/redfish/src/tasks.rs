//! The TaskService's tasks: an action that does not finish within its request answers 202 with
//! a Task (`Location: /redfish/v1/TaskService/Tasks/ID`, `Retry-After`), and the task that
//! carries the work on updates it as the work moves (`TaskState`, `PercentComplete`,
//! `Messages`).
//!
//! # Bounds
//! Finished tasks are kept for [`KEEP_FINISHED`], then dropped (a GET of one is then 404); at
//! most [`MAX_TASKS`] exist, the oldest finished ones dropped first. Tasks live in memory: a
//! restart forgets them (the work they followed is in the VM and goes on).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Message;

pub const KEEP_FINISHED: Duration = Duration::from_secs(10 * 60);
pub const MAX_TASKS: usize = 1000;

/// `Task.TaskState` values used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    Running,
    Completed,
    Exception,
}

impl TaskState {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Running => "Running",
            TaskState::Completed => "Completed",
            TaskState::Exception => "Exception",
        }
    }
}

/// A task as the resource shows it.
#[derive(Clone, Debug)]
pub struct Task {
    pub id: String,
    pub name: String,
    /// The user who started it (only they and unscoped administrators see it; see
    /// [`crate::resources`]' TaskService).
    pub owner: String,
    pub state: TaskState,
    pub percent: u8,
    pub messages: Vec<Message>,
    /// RFC 3339.
    pub start: String,
    pub end: Option<String>,
    /// The resource it acts on (`Payload.TargetUri`).
    pub target: String,
    /// The request's body, for `Payload.JsonBody`.
    pub body: String,
}

struct Entry {
    task: Task,
    finished: Option<Instant>,
}

/// The tasks.
pub struct Tasks {
    entries: Mutex<BTreeMap<u64, Entry>>,
    next: Mutex<u64>,
}

impl Default for Tasks {
    /// Ids start at the milliseconds since the epoch: a restarted service never hands out an id
    /// of a task from before (whose `Location` a client may still poll: it gets 404, never
    /// another task's state).
    fn default() -> Self {
        let start = u64::try_from(jiff::Timestamp::now().as_millisecond()).unwrap_or(0);
        Tasks { entries: Mutex::default(), next: Mutex::new(start) }
    }
}

impl Tasks {
    fn sweep(map: &mut BTreeMap<u64, Entry>) {
        let now = Instant::now();
        map.retain(|_, e| e.finished.is_none_or(|f| now.duration_since(f) < KEEP_FINISHED));
        while map.len() >= MAX_TASKS {
            let Some(oldest) = map.iter().find(|(_, e)| e.finished.is_some()).map(|(k, _)| *k) else { break };
            map.remove(&oldest);
        }
    }

    /// Starts a Running task; returns it.
    pub fn start(&self, name: &str, owner: &str, target: &str, body: &str) -> Task {
        let id = {
            let mut n = self.next.lock().unwrap_or_else(PoisonError::into_inner);
            *n += 1;
            *n
        };
        let task = Task {
            id: id.to_string(),
            name: name.to_owned(),
            owner: owner.to_owned(),
            state: TaskState::Running,
            percent: 0,
            messages: Vec::new(),
            start: jiff::Timestamp::now().to_string(),
            end: None,
            target: target.to_owned(),
            body: body.to_owned(),
        };
        let mut map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        Tasks::sweep(&mut map);
        map.insert(id, Entry { task: task.clone(), finished: None });
        task
    }

    /// Moves a running task's progress.
    pub fn progress(&self, id: &str, percent: u8) {
        let mut map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = id.parse().ok().and_then(|k: u64| map.get_mut(&k)) {
            if e.finished.is_none() {
                e.task.percent = e.task.percent.max(percent.min(99));
            }
        }
    }

    /// Ends a task with `state` and `message`.
    pub fn finish(&self, id: &str, state: TaskState, message: Message) {
        let mut map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = id.parse().ok().and_then(|k: u64| map.get_mut(&k)) {
            e.task.state = state;
            if state == TaskState::Completed {
                e.task.percent = 100;
            }
            e.task.messages.push(message);
            e.task.end = Some(jiff::Timestamp::now().to_string());
            e.finished = Some(Instant::now());
        }
    }

    /// The task `id`, if kept.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<Task> {
        let mut map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        Tasks::sweep(&mut map);
        id.parse().ok().and_then(|k: u64| map.get(&k)).map(|e| e.task.clone())
    }

    /// Every kept task, oldest first.
    #[must_use]
    pub fn list(&self) -> Vec<Task> {
        let mut map = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        Tasks::sweep(&mut map);
        map.values().map(|e| e.task.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::MessageId;

    #[tokio::test(start_paused = true)]
    async fn a_finished_task_is_kept_for_a_while_then_dropped() {
        let t = Tasks::default();
        let task = t.start("Reset", "admin", "/redfish/v1/Systems/x", "{}");
        t.progress(&task.id, 50);
        assert_eq!(t.get(&task.id).unwrap().percent, 50);
        t.finish(&task.id, TaskState::Completed, Message::new(MessageId::Success, &[]));
        let done = t.get(&task.id).unwrap();
        assert_eq!((done.state, done.percent), (TaskState::Completed, 100));
        assert!(done.end.is_some());
        tokio::time::advance(KEEP_FINISHED - Duration::from_secs(1)).await;
        assert!(t.get(&task.id).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(t.get(&task.id).is_none());
    }

    #[tokio::test]
    async fn running_tasks_are_never_dropped_and_ids_are_distinct() {
        let t = Tasks::default();
        let a = t.start("a", "u", "/x", "");
        let b = t.start("b", "u", "/x", "");
        assert_ne!(a.id, b.id);
        assert_eq!(t.list().len(), 2);
        // A service started later (a restart) hands out ids above every id of this one.
        std::thread::sleep(Duration::from_millis(2));
        let later = Tasks::default().start("c", "u", "/x", "");
        assert!(later.id.parse::<u64>().unwrap() > b.id.parse::<u64>().unwrap(), "{} then {}", b.id, later.id);
    }
}
