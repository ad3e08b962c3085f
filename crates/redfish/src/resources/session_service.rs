//! SessionService and its Sessions. An unscoped caller with ConfigureManager sees every session;
//! any other caller — a scoped Administrator included — sees only its own (the others are 404
//! to it, see [`Caller::may_see_session`](crate::auth::Caller::may_see_session)). A session
//! whose account is gone, disabled, or no longer the same account is not listed.

use serde_json::{json, Value};

use super::{link, Ctx, SESSION, SESSION_COLLECTION, SESSION_SERVICE};
use crate::error::RfError;
use crate::sessions::Session;
use crate::uri::Uri;

pub fn service(ctx: &Ctx<'_>) -> Value {
    json!({
        "@odata.id": Uri::SessionService.path(),
        "@odata.type": SESSION_SERVICE.odata_type(),
        "Id": "SessionService",
        "Name": "Session Service",
        "Description": "Redfish sessions (X-Auth-Token); they live in the service's memory and end with it",
        "ServiceEnabled": true,
        "Status": super::status_ok(),
        "SessionTimeout": ctx.svc.sessions.timeout().as_secs(),
        "Sessions": link(&Uri::Sessions),
    })
}

fn visible(ctx: &Ctx<'_>) -> Vec<Session> {
    let Some(c) = ctx.caller else { return Vec::new() };
    ctx.svc.sessions.list().into_iter().filter(|s| c.may_see_session(s) && crate::auth::session_live(ctx.svc, s)).collect()
}

pub fn collection(ctx: &Ctx<'_>) -> Value {
    let members: Vec<Uri> = visible(ctx).into_iter().map(|s| Uri::Session(s.id)).collect();
    super::collection(SESSION_COLLECTION, "Sessions", &Uri::Sessions, &members)
}

pub fn get(ctx: &Ctx<'_>, id: &str) -> Result<Value, RfError> {
    let s = visible(ctx).into_iter().find(|s| s.id == id).ok_or_else(|| RfError::resource_not_found("Session", id))?;
    Ok(json!({
        "@odata.id": Uri::Session(s.id.clone()).path(),
        "@odata.type": SESSION.odata_type(),
        "Id": s.id,
        "Name": "User Session",
        "UserName": s.user,
        "CreatedTime": s.created,
        "SessionType": "Redfish",
        "Password": null,
    }))
}
