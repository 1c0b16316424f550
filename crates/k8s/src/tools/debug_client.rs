//! The client side of the scheduler's debug endpoint ([`crate::debug`]):
//! [`fetch`] asks the scheduler (directly or through the apiserver's
//! service proxy, following a standby to the leader) for a pod's or a
//! queue's report; [`fetch_blocking`] is the CLI's `gpusched explain`
//! (a token from the flags, the kubeconfig or a short-lived ServiceAccount
//! token) and [`failure_text`] what it prints when the answer is not 200.

use crate::client::KubeconfigChoice;
use crate::debug::FORWARDED_AUTH_HEADER;
use anyhow::Context;
use http_body_util::BodyExt;
use kube::api::PostParams;
use kube::{Api, Client};

/// Where `gpusched explain` asks.
#[derive(Clone, Debug)]
pub enum Target {
    /// The scheduler's HTTP address, e.g. `http://10.0.0.5:10259`.
    Endpoint {
        /// Base URL (`https://…` when the scheduler serves TLS).
        url: String,
        /// Bearer token, if any.
        token: Option<String>,
        /// PEM file of the CA that signed the scheduler's certificate
        /// (default: the system's roots).
        ca: Option<std::path::PathBuf>,
        /// Skip verifying the scheduler's certificate (its self-signed one).
        insecure: bool,
    },
    /// Through the apiserver's proxy to the scheduler's Service (and, if
    /// that reaches a standby, to the leader's pod).
    Proxy {
        /// Namespace of the Service and the scheduler pods.
        namespace: String,
        /// The Service's name.
        service: String,
        /// The Service's port (name or number).
        port: String,
        /// The scheduler pods' port number (for the leader's pod when a
        /// standby answers: the pod proxy takes numbers only).
        pod_port: u16,
        /// Bearer token forwarded to the scheduler (the proxy drops the
        /// `Authorization` header), if any.
        token: Option<String>,
        /// The scheduler serves HTTPS (the proxy is asked for
        /// `https:<name>:<port>`; it does not verify the certificate).
        https: bool,
    },
}

/// One answer of the debug endpoint.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// HTTP status.
    pub status: u16,
    /// The body.
    pub body: String,
}

async fn get(client: &Client, uri: &str, token: Option<&str>) -> anyhow::Result<Fetched> {
    let mut b = http::Request::get(uri);
    if let Some(t) = token {
        b = b.header(FORWARDED_AUTH_HEADER, format!("Bearer {t}"));
    }
    let req = b
        .body(kube::client::Body::empty())
        .with_context(|| format!("request {uri}"))?;
    let res = client
        .send(req)
        .await
        .with_context(|| format!("GET {uri}"))?;
    let status = res.status().as_u16();
    let bytes = res
        .into_body()
        .collect()
        .await
        .with_context(|| format!("reading {uri}"))?
        .to_bytes();
    Ok(Fetched {
        status,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// GETs `path` (e.g. `/gpusched/debug/pods/ml/p0`) from the scheduler. `kube`: the
/// client for the proxy (from the kubeconfig).
pub async fn fetch(target: &Target, kube: Option<&Client>, path: &str) -> anyhow::Result<Fetched> {
    match target {
        Target::Endpoint {
            url,
            token,
            ca,
            insecure,
        } => {
            let uri: http::Uri = url
                .parse()
                .with_context(|| format!("--endpoint {url:?} is not a URL"))?;
            let mut config = kube::Config::new(uri);
            if let Some(t) = token {
                config.auth_info.token = Some(t.clone().into());
            }
            if let Some(ca) = ca {
                use rustls_pki_types::pem::PemObject;
                let certs = rustls_pki_types::CertificateDer::pem_file_iter(ca)
                    .with_context(|| format!("--certificate-authority {}", ca.display()))?
                    .map(|c| c.map(|c| c.to_vec()))
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| {
                        format!("--certificate-authority {}: not PEM", ca.display())
                    })?;
                anyhow::ensure!(
                    !certs.is_empty(),
                    "--certificate-authority {}: no CERTIFICATE block",
                    ca.display()
                );
                config.root_cert = Some(certs);
            }
            config.accept_invalid_certs = *insecure;
            // a standby's 503 is an answer, not a transient failure
            config.default_retry = false;
            let client = Client::try_from(config).context("building the HTTP client")?;
            // named: a stale address (a try-out started again on another
            // port) reads as such
            get(&client, path, None)
                .await
                .with_context(|| format!("the scheduler at {url} (--endpoint, $GPUSCHED_ENDPOINT)"))
        }
        Target::Proxy {
            namespace,
            service,
            port,
            pod_port,
            token,
            https,
        } => {
            let client = kube.context("the service proxy needs a kubeconfig")?;
            let scheme = if *https { "https:" } else { "" };
            let uri = format!(
                "/api/v1/namespaces/{namespace}/services/{scheme}{service}:{port}/proxy{path}"
            );
            let first = get(client, &uri, token.as_deref()).await?;
            if first.status != 503 {
                return Ok(first);
            }
            // a standby answered: ask the leader's pod
            let leader = serde_json::from_str::<serde_json::Value>(&first.body)
                .ok()
                .and_then(|v| v.get("leader")?.as_str().map(str::to_string));
            match leader {
                Some(pod) => {
                    let uri = format!(
                        "/api/v1/namespaces/{namespace}/pods/{scheme}{pod}:{pod_port}/proxy{path}"
                    );
                    get(client, &uri, token.as_deref()).await
                }
                None => Ok(first),
            }
        }
    }
}

/// The configuration's bearer token, if its user has one (a token or a
/// token file; client certificates and exec plugins have none).
pub fn config_token(config: &kube::Config) -> Option<String> {
    use secrecy::ExposeSecret;
    if let Some(t) = &config.auth_info.token {
        return Some(t.expose_secret().to_string());
    }
    let f = config.auth_info.token_file.as_ref()?;
    std::fs::read_to_string(f)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The ServiceAccount the chart creates for readers of the debug endpoint
/// (bound to `gpusched-debug-reader`): a kubeconfig user without a bearer
/// token (client certificate, exec plugin) asks for a short-lived token of
/// it (`kubectl create token`), which needs `create` on
/// `serviceaccounts/token` — cluster admins have it.
pub const READER_SERVICE_ACCOUNT: &str = "gpusched-debug-reader";

/// A 10-minute token of the ServiceAccount `namespace/name` (TokenRequest).
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<String> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let tr = TokenRequest {
        spec: Some(TokenRequestSpec {
            // the apiserver's minimum
            expiration_seconds: Some(600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let r = api
        .create_token_request(name, &PostParams::default(), &tr)
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) => anyhow::anyhow!("{} ({})", s.message, s.code),
            e => anyhow::Error::new(e),
        })?;
    r.status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .context("the TokenRequest's answer has no token")
}

/// How [`fetch_blocking`] authenticates to the scheduler when the target
/// has no token.
#[derive(Clone, Debug, Default)]
pub struct TokenSource {
    /// The ServiceAccount `(namespace, name)` to ask a token of when the
    /// kubeconfig user has none (`None`: send no token).
    pub service_account: Option<(String, String)>,
}

/// What the scheduler answered and what the CLI needs to explain a failure.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The answer.
    pub fetched: Fetched,
    /// Where the token came from: `--token`, `kubeconfig`,
    /// `serviceaccount NS/NAME`, or `none`.
    pub token_from: String,
}

/// [`fetch`] on its own runtime, for the CLI: a target without a token
/// gets the kubeconfig user's; a user without one (client certificate,
/// exec plugin) gets a short-lived token of `tokens.service_account`. The
/// proxy uses the kubeconfig.
pub fn fetch_blocking(
    mut target: Target,
    kube: &KubeconfigChoice,
    tokens: &TokenSource,
    path: &str,
) -> anyhow::Result<Answer> {
    super::block_on(async {
        let proxy = matches!(target, Target::Proxy { .. });
        // the endpoint needs no kubeconfig when --token is given
        let token = match &mut target {
            Target::Endpoint { token, .. } | Target::Proxy { token, .. } => token,
        };
        let config = if proxy || token.is_none() {
            match kube.config().await {
                Ok(c) => Some(c),
                Err(e) if proxy => return Err(e),
                Err(_) => None,
            }
        } else {
            None
        };
        let mut token_from = "--token".to_string();
        if token.is_none() {
            token_from = "none".into();
            if let Some(t) = config.as_ref().and_then(config_token) {
                *token = Some(t);
                token_from = "kubeconfig".into();
            } else if let (Some(config), Some((ns, sa))) = (&config, &tokens.service_account) {
                let mut c = config.clone();
                c.default_retry = false;
                let client = Client::try_from(c).context("building the API client")?;
                let t = service_account_token(&client, ns, sa)
                    .await
                    .with_context(|| {
                        format!(
                            "the kubeconfig user has no bearer token (client certificate or exec \
                         plugin), and no token of ServiceAccount {ns}/{sa} could be had for it \
                         (needs `create` on serviceaccounts/token there; pass --token, or see \
                         docs/explain.md)"
                        )
                    })?;
                *token = Some(t);
                token_from = format!("serviceaccount {ns}/{sa}");
            }
        }
        let fetched = match &target {
            Target::Endpoint { .. } => fetch(&target, None, path).await?,
            Target::Proxy { .. } => {
                let mut config = config.context("the service proxy needs a kubeconfig")?;
                // a standby's 503 (passed on by the proxy) is an answer
                config.default_retry = false;
                let client = Client::try_from(config).context("building the API client")?;
                fetch(&target, Some(&client), path).await?
            }
        };
        Ok(Answer {
            fetched,
            token_from,
        })
    })
}

/// One line for an answer other than 200: what the scheduler (or the
/// apiserver's proxy before it) said, and what to do about it.
pub fn failure_text(target: &Target, a: &Answer) -> String {
    // the proxy cannot reach a scheduler outside the cluster (the apiserver
    // refuses loopback endpoints): the one way there, said where it fails
    const OUTSIDE: &str = "; a scheduler run outside the cluster (scripts/tryout's) is named \
                           by --endpoint URL or $GPUSCHED_ENDPOINT";
    let f = &a.fetched;
    let body: Option<serde_json::Value> = serde_json::from_str(&f.body).ok();
    // the apiserver's own answers are Status objects
    let status_obj = body
        .as_ref()
        .filter(|v| v.get("kind").and_then(|k| k.as_str()) == Some("Status"));
    let msg = body
        .as_ref()
        .and_then(|v| {
            v.get("error")
                .or_else(|| v.get("message"))
                .and_then(|e| e.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| f.body.trim().to_string());
    let (who, hint) = match (target, status_obj) {
        (
            Target::Proxy {
                namespace, service, ..
            },
            Some(_),
        ) => {
            let hint = match f.status {
                503 if msg.contains("no endpoints") => format!(
                    "the Service {namespace}/{service} has no ready endpoints: is the scheduler \
                     running and ready? (kubectl -n {namespace} get pods,endpointslices; \
                     gpusched doctor){OUTSIDE}"
                ),
                404 => format!(
                    "is gpusched installed in namespace {namespace} with the Service {service}? \
                     (--scheduler-namespace, --service){OUTSIDE}"
                ),
                403 => format!(
                    "you may not use the apiserver's proxy to {namespace}/{service}: bind the \
                     chart's gpusched-debug-proxy Role (docs/explain.md)"
                ),
                502 | 503 => format!(
                    "the apiserver could not reach the scheduler behind {namespace}/{service} \
                     (--scheme http for a scheduler run with --http-auth none?)"
                ),
                _ => String::new(),
            };
            ("the apiserver's proxy", hint)
        }
        _ => {
            let hint = match f.status {
                401 if a.token_from == "none" => {
                    "no token was sent: pass --token, or use a kubeconfig user with a bearer token"
                        .to_string()
                }
                401 => format!("the token ({}) was refused", a.token_from),
                403 => format!(
                    "the token ({}) may not read the debug endpoint: bind the \
                     gpusched-debug-reader ClusterRole (docs/explain.md)",
                    a.token_from
                ),
                _ => String::new(),
            };
            ("the scheduler", hint)
        }
    };
    if hint.is_empty() {
        format!("{who} answered {}: {msg}", f.status)
    } else {
        format!("{who} answered {}: {msg} — {hint}", f.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxied(status: u16, message: &str) -> String {
        let target = Target::Proxy {
            namespace: "gpusched-system".into(),
            service: "gpusched-scheduler-metrics".into(),
            port: "https".into(),
            pod_port: 10259,
            token: None,
            https: true,
        };
        let body = serde_json::json!({"kind": "Status", "message": message}).to_string();
        let answer = Answer {
            fetched: Fetched { status, body },
            token_from: "kubeconfig".into(),
        };
        failure_text(&target, &answer)
    }

    /// #39 item 1: the try-out's scheduler runs outside the cluster, where
    /// the proxy cannot reach it; when the proxy finds no scheduler, the
    /// message names the way that works.
    #[test]
    fn no_scheduler_behind_the_proxy_names_the_endpoint() {
        let no_service = proxied(404, r#"services "gpusched-scheduler-metrics" not found"#);
        let no_endpoints = proxied(
            503,
            r#"no endpoints available for service "gpusched-scheduler-metrics""#,
        );
        for text in [no_service, no_endpoints] {
            assert!(text.contains("--endpoint URL"), "{text}");
            assert!(text.contains("GPUSCHED_ENDPOINT"), "{text}");
        }
        // a refused proxy is a permission, not a scheduler elsewhere
        assert!(!proxied(403, "forbidden").contains("GPUSCHED_ENDPOINT"));
    }

    /// An address where nothing answers is named in the error.
    #[tokio::test]
    async fn an_endpoint_that_does_not_answer_is_named() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let target = Target::Endpoint {
            url: url.clone(),
            token: None,
            ca: None,
            insecure: false,
        };
        let e = fetch(&target, None, "/gpusched/debug/pending")
            .await
            .unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains(&url), "{text}");
        assert!(text.contains("GPUSCHED_ENDPOINT"), "{text}");
    }
}
