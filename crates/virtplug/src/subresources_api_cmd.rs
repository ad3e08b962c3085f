//! `virtplug subresources-api`: KubeVirt's `subresources.kubevirt.io` (and the node agents'
//! `subresources.virtplug.io` tunnel) as an aggregated API server in cluster mode ([`virtapi`],
//! KubeVirt's virt-api). kube-apiserver proxies `/apis/subresources.kubevirt.io/v1` to it
//! through an `APIService` (deploy/50-subresources-api.yaml).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub struct SubresourcesApiArgs {
    /// Kubeconfig of this component's identity [default: $KUBECONFIG, ~/.kube/config,
    /// in-cluster]. It needs `system:auth-delegator`, the Role
    /// `extension-apiserver-authentication-reader` in kube-system, and its ClusterRole in
    /// deploy/ (VMs, VMIs, Nodes).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Serve HTTPS here (the Service's target port).
    #[arg(long, default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// Serving certificate (PEM, with its chain): the one the APIService's `caBundle` trusts.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Without --tls-cert: a CA is generated here (`ca.crt`) and signs a serving certificate
    /// for the loopback names, the host name and each --tls-san. The directory must be this
    /// user's (or missing: it is created 0700).
    #[arg(long, default_value = "/var/lib/virtplug-subresources-api")]
    cert_dir: PathBuf,
    /// More names of the generated certificate (the Service's DNS names).
    #[arg(long)]
    tls_san: Vec<String>,
    /// Accept a node's console tunnel (`nodes/NODE/tunnel`, `nodes/NODE/streams`) from any
    /// credential RBAC allows, not only from one bound to NODE (the user extra
    /// `authentication.kubernetes.io/node-name`). Only for clusters before Kubernetes 1.30, whose
    /// pod tokens name no node. It reopens what the check closes: the node agents share one role, so a
    /// compromised agent on one node could open another node's tunnel and receive every console
    /// and VNC session of that node's VMs.
    #[arg(long)]
    insecure_tunnels_from_any_node: bool,
}

pub async fn run(args: SubresourcesApiArgs) -> anyhow::Result<()> {
    let client = crate::migrate::connect(args.kubeconfig, "subresources-api").await?;
    let request_header = virtapi::authn::RequestHeader::from_cluster(&client).await?;
    if request_header.is_none() {
        tracing::warn!(
            "ConfigMap kube-system/extension-apiserver-authentication has no requestheader-client-ca-file: requests proxied by kube-apiserver cannot be authenticated, only bearer tokens are"
        );
    }
    let (cert_pem, key_pem) = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => {
            let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()));
            (read(c)?, read(k)?)
        }
        _ => {
            let mut names = crate::redfish_cmd::cert_names(args.listen);
            names.extend(args.tls_san.iter().cloned());
            let dir = args.cert_dir.clone();
            tokio::task::spawn_blocking(move || -> anyhow::Result<(String, String)> {
                tlsserve::pki::ensure(&dir, None).with_context(|| format!("cannot create the CA in {}", dir.display()))?;
                tlsserve::pki::issue_serving_cert(&dir, &dir.join("serving"), &names)
                    .with_context(|| format!("cannot issue the serving certificate from the CA in {}", dir.display()))
            })
            .await??
        }
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    println!(
        "virtplug subresources-api is serving subresources.kubevirt.io at https://{addr} (front proxy: {})",
        if request_header.is_some() { "trusted" } else { "none" }
    );
    let shutdown = CancellationToken::new();
    if args.insecure_tunnels_from_any_node {
        tracing::warn!(
            "--insecure-tunnels-from-any-node: a node's console tunnel is accepted from any credential RBAC allows, so any node agent can take another node's consoles"
        );
    }
    let config = virtapi::Config {
        client,
        request_header,
        cert_pem,
        key_pem,
        connections: tlsserve::Limits::default(),
        node_bound_tunnels: !args.insecure_tunnels_from_any_node,
    };
    let serving = tokio::spawn(virtapi::serve(config, listener, shutdown.clone()));
    let r = crate::serve::signals().await;
    shutdown.cancel();
    serving.await??;
    r
}
