//! Serving gRPC clients that send a socket path as `:authority`.
//!
//! grpc-go sends `localhost` over unix sockets, but the C-core clients
//! (Python, C++, Ruby …; a socket path before 1.57, the percent-encoded path
//! since), grpc-java, and kubelets built before grpc-go fixed its default
//! send the socket path, `unix:///…` or `%2Fvar%2F…` as `:authority`. None
//! of these is a URI authority, and the h2 server resets such a stream with
//! `PROTOCOL_ERROR` before hyper or tonic see it; neither h2 (see its
//! pull request 487, open since 2020) nor hyper nor tonic has an option to
//! accept it.
//!
//! So every gRPC server of the agent is started by [`serve`], which wraps
//! each connection in `FixAuthority`: on the bytes the client sends, it
//! lets the preface and every frame through unchanged except header blocks
//! (`HEADERS` + `CONTINUATION`), which it decodes with `loona-hpack` in the
//! client's HPACK context, and re-encodes as literals without indexing with
//! an `:authority` that is not a valid URI authority replaced by `localhost`
//! (what grpc-go sends). h2's HPACK decoder then never sees the client's
//! dynamic table, so the two never disagree. Bytes towards the client are
//! not touched. Malformed header blocks close the connection, as h2 would.
//!
//! Nothing in the agent reads `:authority`; the device plugin API has one
//! server per socket. The framing is in `rewrite.rs`; the tests (frames
//! built by hand, including what C-core clients send) in `tests.rs`; the
//! end-to-end proofs with real clients are `tests/regressions.rs`
//! (`socket_path_authority_gets_rst_stream`), `e2e/agent/python/run.sh`
//! (grpcio) and `e2e/agent/run.sh` (grpc-go).

mod rewrite;
#[cfg(test)]
mod tests;

use bytes::BytesMut;
use rewrite::{Rewriter, SERVER_MAX_FRAME_SIZE};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;
use tonic::transport::Server;

/// Serves `routes` on `listener` until `shutdown` completes, accepting any
/// `:authority` a client sends (see the module docs).
pub async fn serve(
    listener: UnixListener,
    routes: Routes,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let incoming = UnixListenerStream::new(listener).map(|c| c.map(FixAuthority::new));
    Server::builder()
        // The rewriter writes frames up to this size: the server must
        // accept them whatever its default.
        .max_frame_size(Some(SERVER_MAX_FRAME_SIZE))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// A server-side connection whose incoming header blocks go through a
/// [`Rewriter`]; writes pass through.
#[derive(Debug)]
struct FixAuthority<S> {
    inner: S,
    rewriter: Rewriter,
    input: BytesMut,
    output: BytesMut,
    eof: bool,
    broken: bool,
}

impl<S> FixAuthority<S> {
    fn new(inner: S) -> Self {
        FixAuthority {
            inner,
            rewriter: Rewriter::new(),
            input: BytesMut::new(),
            output: BytesMut::new(),
            eof: false,
            broken: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FixAuthority<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.output.is_empty() {
                let n = buf.remaining().min(this.output.len());
                buf.put_slice(&this.output.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.broken {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "connection closed after a malformed header block",
                )));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        this.eof = true;
                        continue;
                    }
                    this.input.extend_from_slice(rb.filled());
                    if let Err(e) = this.rewriter.feed(&mut this.input, &mut this.output) {
                        tracing::debug!("plugin connection closed: {e}");
                        this.broken = true;
                        this.input.clear();
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FixAuthority<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for FixAuthority<tokio::net::UnixStream> {
    type ConnectInfo = tonic::transport::server::UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
