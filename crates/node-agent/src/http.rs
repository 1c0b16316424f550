//! A tiny HTTP/1 server for `/metrics`, `/healthz` and `/readyz`.

use crate::agent::Agent;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

fn reply(code: StatusCode, ctype: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    if let Ok(v) = ctype.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn route(agent: &Agent, path: &str) -> Response<Full<Bytes>> {
    match path {
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            agent.render_metrics(),
        ),
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if agent.ready() => reply(StatusCode::OK, "text/plain", "ready\n".into()),
        "/readyz" => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not registered with the kubelet\n".into(),
        ),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// Serves until `stop` becomes true.
pub async fn serve(agent: Arc<Agent>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Ok((stream, _)) = conn else { continue };
        let agent = agent.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = route(&agent, req.uri().path());
                async move { Ok::<_, std::convert::Infallible>(r) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!("http connection: {e}");
            }
        });
    }
}
