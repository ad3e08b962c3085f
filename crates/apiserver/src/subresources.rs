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

/// `PUT .../{plural}/{name}/addvolume|removevolume`.
///
/// # Errors
/// 413 for a body over the limit; see [`volumes::handle`].
pub async fn volumes(mut c: Call<'_>) -> Result<Response, ApiError> {
    let dry = c.dry_run_query();
    let body = c.body().await?;
    volumes::handle(&c.st.objects, c.capture("plural"), c.capture("namespace"), c.capture("name"), c.capture("sub"), &body, dry).await
}

/// `PUT .../virtualmachines/{name}/start|stop|restart`.
///
/// # Errors
/// 413 for a body over the limit; see [`lifecycle::handle`].
pub async fn lifecycle(mut c: Call<'_>) -> Result<Response, ApiError> {
    let dry = c.dry_run_query();
    let body = c.body().await?;
    lifecycle::handle(&c.st.objects, c.capture("namespace"), c.capture("name"), c.capture("sub"), &body, dry).await
}

/// `PUT .../virtualmachineinstances/{name}/pause|unpause|softreboot`.
///
/// # Errors
/// 413 for a body over the limit; see [`vmi_actions::handle`].
pub async fn vmi_action(mut c: Call<'_>) -> Result<Response, ApiError> {
    let dry = c.dry_run_query();
    let body = c.body().await?;
    vmi_actions::handle(&c.st.objects, c.capture("namespace"), c.capture("name"), c.capture("sub"), &body, dry).await
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
