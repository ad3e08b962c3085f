//! KubeVirt's subresources (`/apis/subresources.kubevirt.io/v1`): `PUT` on
//! - `virtualmachines|virtualmachineinstances/NAME/addvolume|removevolume`: [`volumes`];
//! - `virtualmachines/NAME/start|stop|restart`: [`lifecycle`];
//! - `virtualmachineinstances/NAME/pause|unpause|softreboot`: [`vmi_actions`].
//!
//! And `GET` on `virtualmachineinstances/NAME/console|vnc`, websockets to the VMI's serial
//! console and VNC server ([`console`]).
//!
//! [`access`] is what they need of the objects, so the aggregated subresources API
//! (`virtplug subresources-api`) serves them too, through a kube-apiserver.
//!
//! And core/v1's `pods/NAME/binding` (`POST`, [`binding`]), which kube-scheduler uses.
//!
//! Each reads its options body (up to the body limit) and `?dryRun=All`, and records the
//! change on the object; the controller and node agent carry it out.

pub mod access;
pub mod binding;
pub mod console;
pub mod lifecycle;
pub mod vmi_actions;
pub mod volumes;

use axum::body::Bytes;
use axum::response::Response;
use serde_json::{json, Value};

use crate::call::Call;
use crate::status::ApiError;

/// `/apis/subresources.kubevirt.io/v1`
#[must_use]
pub fn resource_list() -> Value {
    let mut resources = Vec::new();
    for (plural, kind) in [("virtualmachines", "VirtualMachine"), ("virtualmachineinstances", "VirtualMachineInstance")] {
        for sub in volumes::SUBRESOURCES {
            resources.push(
                json!({"name": format!("{plural}/{sub}"), "singularName": "", "namespaced": true, "kind": kind, "verbs": ["update"]}),
            );
        }
    }
    for sub in lifecycle::SUBRESOURCES {
        resources.push(json!({"name": format!("virtualmachines/{sub}"), "singularName": "", "namespaced": true, "kind": "VirtualMachine", "verbs": ["update"]}));
    }
    for sub in vmi_actions::SUBRESOURCES {
        resources.push(json!({"name": format!("virtualmachineinstances/{sub}"), "singularName": "", "namespaced": true, "kind": "VirtualMachineInstance", "verbs": ["update"]}));
    }
    for sub in console::SUBRESOURCES {
        resources.push(json!({"name": format!("virtualmachineinstances/{sub}"), "singularName": "", "namespaced": true, "kind": "VirtualMachineInstance", "verbs": ["get"]}));
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "subresources.kubevirt.io/v1", "resources": resources})
}

/// A `PUT` on a subresource: what the handlers of [`volumes`], [`lifecycle`] and
/// [`vmi_actions`] get.
#[derive(Clone, Copy, Debug)]
pub struct Put<'a> {
    /// `virtualmachines` or `virtualmachineinstances`.
    pub plural: &'a str,
    pub ns: &'a str,
    pub name: &'a str,
    pub sub: &'a str,
    /// The options body (may be empty).
    pub body: &'a [u8],
    /// `?dryRun=All`.
    pub query_dry_run: bool,
}

/// Runs the handler of `put`'s subresource, wherever the objects are ([`access`]): what
/// `virtplug subresources-api` and the CLI's fallback serve.
///
/// # Errors
/// 404 for a subresource not served on `put.plural`; the handler's refusals.
pub async fn put<O: access::ObjectAccess>(objects: &O, put: &Put<'_>) -> Result<Response, ApiError> {
    let (vm, vmi) = (put.plural == "virtualmachines", put.plural == "virtualmachineinstances");
    if (vm || vmi) && volumes::SUBRESOURCES.contains(&put.sub) {
        volumes::handle(objects, put).await
    } else if vm && lifecycle::SUBRESOURCES.contains(&put.sub) {
        lifecycle::handle(objects, put).await
    } else if vmi && vmi_actions::SUBRESOURCES.contains(&put.sub) {
        vmi_actions::handle(objects, put).await
    } else {
        Err(ApiError::no_resource())
    }
}

/// The request's subresource `PUT`, its body read.
async fn read_put(c: &mut Call<'_>) -> Result<(Bytes, bool), ApiError> {
    let dry = c.dry_run_query();
    Ok((c.body().await?, dry))
}

fn put_of<'a>(c: &'a Call<'_>, body: &'a [u8], query_dry_run: bool) -> Put<'a> {
    Put { plural: c.capture("plural"), ns: c.capture("namespace"), name: c.capture("name"), sub: c.capture("sub"), body, query_dry_run }
}

/// `PUT .../{plural}/{name}/addvolume|removevolume`.
///
/// # Errors
/// 413 for a body over the limit; see [`volumes::handle`].
pub async fn volumes(mut c: Call<'_>) -> Result<Response, ApiError> {
    let (body, dry) = read_put(&mut c).await?;
    volumes::handle(&c.st.objects, &put_of(&c, &body, dry)).await
}

/// `PUT .../virtualmachines/{name}/start|stop|restart`.
///
/// # Errors
/// 413 for a body over the limit; see [`lifecycle::handle`].
pub async fn lifecycle(mut c: Call<'_>) -> Result<Response, ApiError> {
    let (body, dry) = read_put(&mut c).await?;
    lifecycle::handle(&c.st.objects, &put_of(&c, &body, dry)).await
}

/// `PUT .../virtualmachineinstances/{name}/pause|unpause|softreboot`.
///
/// # Errors
/// 413 for a body over the limit; see [`vmi_actions::handle`].
pub async fn vmi_action(mut c: Call<'_>) -> Result<Response, ApiError> {
    let (body, dry) = read_put(&mut c).await?;
    vmi_actions::handle(&c.st.objects, &put_of(&c, &body, dry)).await
}

/// `POST /api/v1/namespaces/{namespace}/pods/{name}/binding`.
///
/// # Errors
/// 413 for a body over the limit; see [`binding::handle`].
pub async fn binding(mut c: Call<'_>) -> Result<Response, ApiError> {
    let dry = c.dry_run_query();
    let body = c.body().await?;
    binding::handle(&c.st.objects, c.capture("namespace"), c.capture("name"), &body, dry).await
}
