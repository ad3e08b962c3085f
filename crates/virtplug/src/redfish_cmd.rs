//! `virtplug redfish` (the Redfish service against an API server, or inside `up`) and
//! `virtplug redfish account ...` (its accounts, as Secrets in `virtplug-system`).

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use tokio_util::sync::CancellationToken;

use redfish::accounts::store::{self, NewAccount};
use redfish::accounts::{check_password, check_username, Role, Scope, Selector};

/// The Redfish service's default address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8443";

/// Arguments of `virtplug redfish`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RedfishArgs {
    #[command(subcommand)]
    cmd: Option<RedfishCmd>,
    /// Kubeconfig [default: $KUBECONFIG, ~/.kube/config, in-cluster, then the `up` data dir's].
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Address of the HTTPS listener.
    #[arg(long, default_value = DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// The data dir: the service keeps its UUID, settings, certificate and the first password
    /// in DATA_DIR/redfish, and takes its certificate from the CA in DATA_DIR/pki [default: the
    /// `up` data dir, so the API server's CA].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Serving certificate (PEM, with its chain) instead of one from the generated CA.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve Prometheus metrics (`/metrics`: failed logins, responses by code, API client
    /// requests) over plain HTTP on this address; keep it on loopback [default: off. In `up`
    /// they are in the API server's /metrics].
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// The CA that signs the generated serving certificate [default: DATA_DIR/pki].
    #[arg(long)]
    ca_dir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum RedfishCmd {
    /// Manage the accounts (Secrets in the virtplug-system namespace).
    Account {
        #[command(subcommand)]
        cmd: AccountCmd,
    },
}

#[derive(Subcommand)]
enum AccountCmd {
    /// Add an account; its password is read from stdin.
    Add(AddArgs),
    /// Change an account's password (read from stdin).
    SetPassword { name: String },
    /// Delete an account.
    Delete { name: String },
    /// List the accounts.
    List,
}

#[derive(Args)]
struct AddArgs {
    name: String,
    #[arg(long, default_value = "ReadOnly", value_parser = ["Administrator", "Operator", "ReadOnly"])]
    role: String,
    /// Namespaces whose VMs the account sees (repeat; none: every namespace).
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// Label selector on the VMs the account sees (`bmc=yes,env in (a,b)`).
    #[arg(long)]
    selector: Option<String>,
}

pub async fn run(args: RedfishArgs) -> anyhow::Result<()> {
    let client = crate::migrate::connect(args.kubeconfig.clone(), "redfish").await?;
    match args.cmd {
        Some(RedfishCmd::Account { cmd }) => account(&client, cmd).await,
        None => serve(client, args).await,
    }
}

/// The password on stdin (its first line).
fn password_from_stdin() -> anyhow::Result<String> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).context("cannot read the password from stdin")?;
    let pw = s.lines().next().unwrap_or_default().to_owned();
    if pw.is_empty() {
        bail!("give the password on stdin, e.g. `printf '%s' \"$PASSWORD\" | virtplug redfish account ...`");
    }
    check_password(&pw).map_err(anyhow::Error::msg)?;
    Ok(pw)
}

async fn account(client: &kube::Client, cmd: AccountCmd) -> anyhow::Result<()> {
    match cmd {
        AccountCmd::Add(a) => {
            check_username(&a.name).map_err(anyhow::Error::msg)?;
            let role = Role::parse(&a.role).context("--role: Administrator, Operator or ReadOnly")?;
            let selector = Selector::parse(a.selector.as_deref().unwrap_or_default()).map_err(|e| anyhow::anyhow!("--selector: {e}"))?;
            // Namespace names (DNS-1123 labels): one per --namespace, so never a comma list.
            if let Some(c) = a.namespaces.iter().flat_map(|n| api::validation::dns1123_label(n, "--namespace")).next() {
                bail!("{}: {} (give one namespace per --namespace)", c.field, c.message);
            }
            let password = password_from_stdin()?;
            let new =
                NewAccount { username: a.name.clone(), password, role, enabled: true, scope: Scope { namespaces: a.namespaces, selector } };
            store::create(client, new).await.with_context(|| format!("cannot add the Redfish account {:?}", a.name))?;
            println!("redfish account {} added ({})", a.name, role.as_str());
        }
        AccountCmd::SetPassword { name } => {
            let password = password_from_stdin()?;
            store::update(client, &name, Some(&password), |_| Ok(()))
                .await
                .with_context(|| format!("cannot set the password of {name:?}"))?;
            println!("redfish account {name}: password changed");
        }
        AccountCmd::Delete { name } => {
            store::delete(client, &name).await.with_context(|| format!("cannot delete the Redfish account {name:?}"))?;
            println!("redfish account {name} deleted");
        }
        AccountCmd::List => {
            let accounts = store::list(client).await.context("cannot list the Redfish accounts")?;
            let rows: Vec<[String; 5]> = accounts
                .iter()
                .map(|a| {
                    let ns = if a.scope.namespaces.is_empty() { "*".to_owned() } else { a.scope.namespaces.join(",") };
                    [a.username.clone(), a.role.as_str().to_owned(), a.enabled.to_string(), ns, a.scope.selector.as_str().to_owned()]
                })
                .collect();
            let header = ["NAME", "ROLE", "ENABLED", "NAMESPACES", "SELECTOR"].map(str::to_owned);
            let widths: Vec<usize> = (0..5).map(|i| std::iter::once(&header).chain(&rows).map(|r| r[i].len()).max().unwrap_or(0)).collect();
            for r in std::iter::once(&header).chain(&rows) {
                let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
                println!("{}", line.join("   ").trim_end());
            }
        }
    }
    Ok(())
}

/// The names the generated certificate covers: loopback, the listen address, the host name.
pub(crate) fn cert_names(listen: SocketAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned(), crate::serve::host_name()];
    if !listen.ip().is_unspecified() && !names.contains(&listen.ip().to_string()) {
        names.push(listen.ip().to_string());
    }
    names
}

/// The TLS configuration: `--tls-cert/--tls-key`, else a certificate issued by the CA in
/// `ca_dir` into `DIR/tls`.
fn tls(
    dir: &Path,
    ca_dir: &Path,
    cert: Option<&Path>,
    key: Option<&Path>,
    listen: SocketAddr,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let cfg = match (cert, key) {
        (Some(c), Some(k)) => tlsserve::load_server_config(c, k)?,
        _ => {
            let (c, k) = tlsserve::pki::issue_serving_cert(ca_dir, &dir.join("tls"), &cert_names(listen))
                .with_context(|| format!("cannot issue the Redfish serving certificate from the CA in {}", ca_dir.display()))?;
            tlsserve::server_config(&c, &k)?
        }
    };
    Ok(Arc::new(cfg))
}

/// A bound, started Redfish service.
pub struct Running {
    pub url: String,
    /// The first start's password file, or the one from an earlier start if still there.
    pub password_file: Option<PathBuf>,
    serve: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

/// Binds `listen`, starts the service over `dir` and returns it ready to serve until `shutdown`.
async fn start(
    client: kube::Client,
    dir: &Path,
    listen: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| {
        format!("cannot listen on {listen} for Redfish: is another virtplug running? choose another address with --redfish-listen")
    })?;
    let addr = listener.local_addr().context("cannot read the Redfish listen address")?;
    let started = redfish::Service::start(client, dir).await.context("cannot start the Redfish service")?;
    let host = if addr.ip().is_unspecified() { "127.0.0.1".to_owned() } else { addr.ip().to_string() };
    let host = if addr.is_ipv6() { format!("[{host}]") } else { host };
    let url = format!("https://{host}:{}", addr.port());
    // `virtplug vm bmc` reads it to print the BMC address.
    durable::write_atomic(&dir.join("endpoint"), url.as_bytes(), 0o644).context("cannot write the Redfish endpoint file")?;
    let file = dir.join(store::INITIAL_PASSWORD_FILE);
    let password_file = started.initial_password.or_else(|| file.exists().then_some(file));
    let router = redfish::router(started.service);
    let watches = started.watches;
    let serve = Box::pin(async move {
        tlsserve::serve(listener, router, tls, tlsserve::Limits::default(), shutdown).await;
        watches.abort();
    });
    Ok(Running { url, password_file, serve })
}

/// `--redfish-listen`'s default: 127.0.0.1:8443, or an ephemeral port when the API listens on
/// one (`--listen ...:0`), so that instances started side by side (tests) never collide.
#[must_use]
pub fn default_listen(api: SocketAddr) -> SocketAddr {
    let fixed: SocketAddr = DEFAULT_LISTEN.parse().unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8443)));
    if api.port() == 0 {
        SocketAddr::new(fixed.ip(), 0)
    } else {
        fixed
    }
}

/// Starts the Redfish service inside `up`: HTTPS with a certificate from the API server's CA,
/// state in `DATA_DIR/redfish`, served under the server's health registry until `shutdown`.
pub async fn start_in_up(
    server: &apiserver::Server,
    client: kube::Client,
    data_dir: &Path,
    listen: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    let dir = data_dir.join("redfish");
    store::private_dir(&dir)?;
    let tls = tls(&dir, &data_dir.join("pki"), None, None, listen)?;
    let mut running = start(client, &dir, listen, tls, shutdown).await?;
    let serve = std::mem::replace(&mut running.serve, Box::pin(async {}));
    server.health().spawn("redfish", async move {
        serve.await;
        Ok::<(), std::convert::Infallible>(())
    });
    Ok(running)
}

/// `virtplug redfish`: the service against the API of the kubeconfig, until SIGINT.
async fn serve(client: kube::Client, args: RedfishArgs) -> anyhow::Result<()> {
    // As in `up`: the service's state in DATA_DIR/redfish, its certificate from DATA_DIR/pki
    // (on `up`'s machine and data dir, the API server's CA; elsewhere a CA of its own).
    let data_dir = args.data_dir.unwrap_or_else(crate::default_data_dir);
    store::private_dir(&data_dir)?;
    let dir = data_dir.join("redfish");
    store::private_dir(&dir)?;
    let ca_dir = args.ca_dir.unwrap_or_else(|| data_dir.join("pki"));
    let tls = tls(&dir, &ca_dir, args.tls_cert.as_deref(), args.tls_key.as_deref(), args.listen)?;
    let shutdown = CancellationToken::new();
    let metrics = match args.metrics_listen {
        Some(addr) => Some(serve_metrics(addr, shutdown.clone()).await?),
        None => None,
    };
    let running = start(client, &dir, args.listen, tls, shutdown.clone()).await?;
    match metrics {
        Some(addr) => println!("virtplug redfish is serving Redfish at {}/redfish/v1/ (metrics at http://{addr}/metrics)", running.url),
        None => println!("virtplug redfish is serving Redfish at {}/redfish/v1/", running.url),
    }
    println!("  data dir: {}", dir.display());
    if let Some(line) = running.admin_line() {
        println!("  {line}");
    }
    tokio::select! {
        () = running.serve => bail!("the Redfish listener stopped"),
        r = tokio::signal::ctrl_c() => r.context("cannot wait for SIGINT")?,
    }
    shutdown.cancel();
    Ok(())
}

impl Running {
    /// The banner's account line: the first account's password (read from its 0600 file while
    /// that file is there: delete it once the password is kept elsewhere), else where the
    /// accounts are.
    #[must_use]
    pub fn admin_line(&self) -> Option<String> {
        let f = self.password_file.as_ref()?;
        let pw = std::fs::read_to_string(f).ok()?;
        Some(format!("user admin, password {} (also in {}; delete that file once kept elsewhere)", pw.trim(), f.display()))
    }
}

/// Serves the standalone service's metrics (its own and its API client's) on `addr` until
/// `shutdown`; the bound address.
async fn serve_metrics(addr: SocketAddr, shutdown: CancellationToken) -> anyhow::Result<SocketAddr> {
    let mut registry = prometheus_client::registry::Registry::default();
    redfish::metrics::register(&mut registry);
    client::metrics::register(&mut registry);
    let registry: apiserver::metrics::SharedRegistry = Arc::new(std::sync::Mutex::new(registry));
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("--metrics-listen: cannot listen on {addr}"))?;
    let bound = listener.local_addr().context("cannot read the metrics listen address")?;
    let app =
        axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let registry = Arc::clone(&registry);
                async move {
                    ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], apiserver::metrics::render(&registry))
                }
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
            tracing::error!("the metrics listener stopped: {e}");
        }
    });
    Ok(bound)
}

/// The BMC address metal3 and Ironic take for a VM with `uid`.
#[must_use]
pub fn bmc_address(url: &str, uid: &str) -> String {
    format!("redfish-virtualmedia+{url}/redfish/v1/Systems/{uid}")
}

/// The Redfish URL `up` on `data_dir` announced, else the default.
#[must_use]
pub fn endpoint(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("redfish/endpoint")).map_or_else(|_| format!("https://{DEFAULT_LISTEN}"), |s| s.trim().to_owned())
}
