//! TaskService and its Tasks ([`crate::tasks`]). A caller sees the tasks it started; an
//! unscoped caller with ConfigureManager sees every task. A scoped caller sees only tasks whose
//! target System its scope sees: a task of any other System is 404 to it, like that System (its
//! `Name` and `Payload` name the System).

use serde_json::{json, Value};

use super::{link, Ctx, TASK, TASK_COLLECTION, TASK_SERVICE};
use crate::accounts::Privilege;
use crate::auth::Caller;
use crate::error::{Message, RfError};
use crate::tasks::{Task, TaskState};
use crate::uri::Uri;

pub fn service() -> Value {
    json!({
        "@odata.id": Uri::TaskService.path(),
        "@odata.type": TASK_SERVICE.odata_type(),
        "Id": "TaskService",
        "Name": "Task Service",
        "Description": "Actions that outlast their request (finished tasks are kept for 10 minutes)",
        "ServiceEnabled": true,
        "Status": super::status_ok(),
        "DateTime": jiff::Timestamp::now().to_string(),
        "CompletedTaskOverWritePolicy": "Oldest",
        "LifeCycleEventOnTaskStateChange": false,
        "Tasks": link(&Uri::Tasks),
    })
}

/// Whether `c`'s scope sees the System task `t` acts on (an unscoped caller sees every task's,
/// even of a System since deleted; a scoped one none but of Systems it sees now).
fn sees_target(ctx: &Ctx<'_>, c: &Caller, t: &Task) -> bool {
    if c.scope.is_unrestricted() {
        return true;
    }
    match Uri::parse(&t.target) {
        Some(Uri::System(id) | Uri::SystemReset(id)) => ctx.svc.cache.vm(&id, &c.scope).is_some(),
        _ => false,
    }
}

fn visible(ctx: &Ctx<'_>) -> Vec<Task> {
    let Some(c) = ctx.caller else { return Vec::new() };
    ctx.svc
        .tasks
        .list()
        .into_iter()
        .filter(|t| (t.owner == c.user || c.has(Privilege::ConfigureManager)) && sees_target(ctx, c, t))
        .collect()
}

pub fn collection(ctx: &Ctx<'_>) -> Value {
    let members: Vec<Uri> = visible(ctx).into_iter().map(|t| Uri::Task(t.id)).collect();
    super::collection(TASK_COLLECTION, "Tasks", &Uri::Tasks, &members)
}

pub fn get(ctx: &Ctx<'_>, id: &str) -> Result<Value, RfError> {
    let t = visible(ctx).into_iter().find(|t| t.id == id).ok_or_else(|| RfError::resource_not_found("Task", id))?;
    let health = match t.state {
        TaskState::Exception => "Critical",
        _ => "OK",
    };
    let mut v = json!({
        "@odata.id": Uri::Task(t.id.clone()).path(),
        "@odata.type": TASK.odata_type(),
        "Id": t.id,
        "Name": t.name,
        "TaskState": t.state.as_str(),
        "TaskStatus": health,
        "PercentComplete": t.percent,
        "StartTime": t.start,
        "Messages": t.messages.iter().map(Message::to_json).collect::<Vec<_>>(),
        "Payload": {"HttpOperation": "POST", "TargetUri": t.target, "JsonBody": t.body, "HttpHeaders": []},
    });
    if let Some(end) = t.end {
        v["EndTime"] = json!(end);
    }
    Ok(v)
}
