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
//! So each plugin connection is wrapped in [`FixAuthority`]: on the bytes
//! the client sends, it lets the preface and every frame through unchanged
//! except header blocks (`HEADERS` + `CONTINUATION`), which it decodes with
//! its own HPACK decoder, and re-encodes as literals without indexing with
//! an `:authority` that is not a valid URI authority replaced by `localhost`
//! (what grpc-go sends). h2's HPACK decoder then never sees the client's
//! dynamic table, so the two never disagree. Bytes towards the client are
//! not touched. Malformed header blocks close the connection, as h2 would.
//!
//! Nothing in the agent reads `:authority`; the device plugin API has one
//! server per socket.

pub mod hpack;

use bytes::{Buf, BytesMut};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// SETTINGS_MAX_FRAME_SIZE of the plugin server (set explicitly on the
/// server builder, so frames written here always fit).
pub const SERVER_MAX_FRAME_SIZE: u32 = 16_384;
/// SETTINGS_HEADER_TABLE_SIZE of the plugin server (h2's default, never
/// changed): the largest dynamic table a client may use.
pub const SERVER_HEADER_TABLE_SIZE: usize = 4096;
/// Largest header block (encoded, all fragments) accepted; gRPC requests
/// carry a few hundred bytes.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Largest decoded header list accepted.
pub const MAX_HEADER_LIST: usize = 64 * 1024;

/// The value sent instead of an `:authority` that is not a URI authority.
pub const REPLACEMENT: &[u8] = b"localhost";

/// The client broke HTTP/2 framing or HPACK; the connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("http/2: {0}")]
    Protocol(&'static str),
    #[error("http/2: header block of {got} bytes exceeds {max}")]
    BlockTooLarge { got: usize, max: usize },
    #[error(transparent)]
    Hpack(#[from] hpack::HpackError),
}

#[derive(Debug)]
enum State {
    /// Bytes of the preface matched so far.
    Preface(usize),
    /// At a frame boundary.
    Frames,
    /// Payload bytes of a frame still to forward unchanged.
    Forward(usize),
    /// Not HTTP/2 with prior knowledge: forward everything, h2 answers.
    Raw,
}

/// A header block being collected from HEADERS and CONTINUATION frames.
#[derive(Debug)]
struct Pending {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

/// The client-to-server byte stream rewriter (no I/O; see [`FixAuthority`]).
#[derive(Debug)]
pub struct Rewriter {
    state: State,
    decoder: hpack::Decoder,
    pending: Option<Pending>,
    /// How many `:authority` values were replaced.
    pub replaced: u64,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

/// True when h2 accepts `v` as `:authority`.
pub fn is_valid_authority(v: &[u8]) -> bool {
    http::uri::Authority::try_from(v).is_ok()
}

impl Rewriter {
    pub fn new() -> Rewriter {
        Rewriter {
            state: State::Preface(0),
            decoder: hpack::Decoder::new(SERVER_HEADER_TABLE_SIZE, MAX_HEADER_LIST),
            pending: None,
            replaced: 0,
        }
    }

    /// Consumes what it can of `input` (leaving an incomplete frame there)
    /// and appends the bytes for the server to `out`.
    pub fn feed(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> Result<(), RewriteError> {
        loop {
            match self.state {
                State::Raw => {
                    out.extend_from_slice(&input.split());
                    return Ok(());
                }
                State::Preface(n) => {
                    let k = input.len().min(PREFACE.len() - n);
                    if input[..k] != PREFACE[n..n + k] {
                        self.state = State::Raw;
                        continue;
                    }
                    out.extend_from_slice(&input.split_to(k));
                    if n + k == PREFACE.len() {
                        self.state = State::Frames;
                    } else {
                        self.state = State::Preface(n + k);
                        return Ok(());
                    }
                }
                State::Forward(left) => {
                    let k = left.min(input.len());
                    out.extend_from_slice(&input.split_to(k));
                    if k == left {
                        self.state = State::Frames;
                    } else {
                        self.state = State::Forward(left - k);
                        return Ok(());
                    }
                }
                State::Frames => {
                    if input.len() < FRAME_HEADER {
                        return Ok(());
                    }
                    let len = (usize::from(input[0]) << 16)
                        | (usize::from(input[1]) << 8)
                        | usize::from(input[2]);
                    let ty = input[3];
                    let flags = input[4];
                    let stream =
                        u32::from_be_bytes([input[5], input[6], input[7], input[8]]) & 0x7fff_ffff;
                    if let Some(p) = &self.pending
                        && (ty != TYPE_CONTINUATION || stream != p.stream)
                    {
                        return Err(RewriteError::Protocol(
                            "a header block was interrupted by another frame",
                        ));
                    }
                    if ty != TYPE_HEADERS && ty != TYPE_CONTINUATION {
                        out.extend_from_slice(&input.split_to(FRAME_HEADER));
                        self.state = if len == 0 {
                            State::Frames
                        } else {
                            State::Forward(len)
                        };
                        continue;
                    }
                    if len > MAX_HEADER_BLOCK {
                        return Err(RewriteError::BlockTooLarge {
                            got: len,
                            max: MAX_HEADER_BLOCK,
                        });
                    }
                    if input.len() < FRAME_HEADER + len {
                        input.reserve(FRAME_HEADER + len - input.len());
                        return Ok(());
                    }
                    input.advance(FRAME_HEADER);
                    let payload = input.split_to(len);
                    self.header_frame(ty, flags, stream, &payload, out)?;
                }
            }
        }
    }

    fn header_frame(
        &mut self,
        ty: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), RewriteError> {
        if ty == TYPE_HEADERS {
            let mut body = payload;
            let mut pad = 0usize;
            if flags & FLAG_PADDED != 0 {
                let (&p, rest) = body.split_first().ok_or(RewriteError::Protocol(
                    "padded HEADERS without a pad length",
                ))?;
                pad = usize::from(p);
                body = rest;
            }
            let mut priority = None;
            if flags & FLAG_PRIORITY != 0 {
                if body.len() < 5 {
                    return Err(RewriteError::Protocol("HEADERS too short for its priority"));
                }
                let mut p = [0u8; 5];
                p.copy_from_slice(&body[..5]);
                priority = Some(p);
                body = &body[5..];
            }
            if pad > body.len() {
                return Err(RewriteError::Protocol("HEADERS padding exceeds the frame"));
            }
            let fragment = &body[..body.len() - pad];
            self.pending = Some(Pending {
                stream,
                flags,
                priority,
                block: fragment.to_vec(),
            });
        } else {
            let p = self
                .pending
                .as_mut()
                .ok_or(RewriteError::Protocol("CONTINUATION without HEADERS"))?;
            let got = p.block.len() + payload.len();
            if got > MAX_HEADER_BLOCK {
                return Err(RewriteError::BlockTooLarge {
                    got,
                    max: MAX_HEADER_BLOCK,
                });
            }
            p.block.extend_from_slice(payload);
        }
        if flags & FLAG_END_HEADERS == 0 {
            return Ok(());
        }
        let Some(p) = self.pending.take() else {
            return Err(RewriteError::Protocol("END_HEADERS without a header block"));
        };
        let mut fields = self.decoder.decode(&p.block)?;
        for f in &mut fields {
            if f.name == b":authority" && !is_valid_authority(&f.value) {
                tracing::debug!(
                    authority = %String::from_utf8_lossy(&f.value[..f.value.len().min(128)]),
                    "replacing an :authority that is not a URI authority with localhost"
                );
                f.value = REPLACEMENT.to_vec();
                self.replaced += 1;
            }
        }
        let block = hpack::encode_literal(&fields);
        write_header_frames(out, p.stream, p.flags & FLAG_END_STREAM, p.priority, &block);
        Ok(())
    }
}

fn frame_header(out: &mut BytesMut, len: usize, ty: u8, flags: u8, stream: u32) {
    // `len` ≤ SERVER_MAX_FRAME_SIZE, so it fits in 24 bits.
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, ty, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// HEADERS then CONTINUATION frames carrying `block`, each within the
/// server's frame size.
fn write_header_frames(
    out: &mut BytesMut,
    stream: u32,
    end_stream: u8,
    priority: Option<[u8; 5]>,
    block: &[u8],
) {
    let max = SERVER_MAX_FRAME_SIZE as usize;
    let prio_len = if priority.is_some() { 5 } else { 0 };
    let first = block.len().min(max - prio_len);
    let mut flags = end_stream;
    if priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if first == block.len() {
        flags |= FLAG_END_HEADERS;
    }
    frame_header(out, first + prio_len, TYPE_HEADERS, flags, stream);
    if let Some(p) = priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(&block[..first]);
    let mut rest = &block[first..];
    while !rest.is_empty() {
        let k = rest.len().min(max);
        let flags = if k == rest.len() { FLAG_END_HEADERS } else { 0 };
        frame_header(out, k, TYPE_CONTINUATION, flags, stream);
        out.extend_from_slice(&rest[..k]);
        rest = &rest[k..];
    }
}

/// A server-side connection whose incoming header blocks go through a
/// [`Rewriter`]; writes pass through.
#[derive(Debug)]
pub struct FixAuthority<S> {
    inner: S,
    rewriter: Rewriter,
    input: BytesMut,
    output: BytesMut,
    eof: bool,
    broken: bool,
}

impl<S> FixAuthority<S> {
    pub fn new(inner: S) -> Self {
        FixAuthority {
            inner,
            rewriter: Rewriter::new(),
            input: BytesMut::new(),
            output: BytesMut::new(),
            eof: false,
            broken: false,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
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

#[cfg(test)]
mod tests {
    use super::hpack::{Decoder, Field, huffman_encode, write_int};
    use super::*;

    fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        frame_header(&mut b, payload.len(), ty, flags, stream);
        b.extend_from_slice(payload);
        b.to_vec()
    }

    /// Request headers with `:authority` as a literal with incremental
    /// indexing (Huffman-coded when `huff`).
    fn request_block(authority: &[u8], huff: bool) -> Vec<u8> {
        let mut b = vec![0x83, 0x86]; // :method POST, :scheme http
        write_int(&mut b, 0x00, 4, 4); // :path, literal
        let path = b"/v1beta1.DevicePlugin/Allocate";
        write_int(&mut b, 0, 7, path.len());
        b.extend_from_slice(path);
        write_int(&mut b, 0x40, 6, 1); // :authority, incremental indexing
        if huff {
            let h = huffman_encode(authority);
            write_int(&mut b, 0x80, 7, h.len());
            b.extend_from_slice(&h);
        } else {
            write_int(&mut b, 0, 7, authority.len());
            b.extend_from_slice(authority);
        }
        b
    }

    fn run(r: &mut Rewriter, bytes: &[u8], step: usize) -> Vec<u8> {
        let mut input = BytesMut::new();
        let mut out = BytesMut::new();
        for c in bytes.chunks(step.max(1)) {
            input.extend_from_slice(c);
            r.feed(&mut input, &mut out).unwrap();
        }
        assert!(input.is_empty(), "left over: {input:?}");
        out.to_vec()
    }

    /// Splits server-bound bytes back into frames after the preface.
    fn frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert_eq!(&bytes[..24], PREFACE);
        let mut b = &bytes[24..];
        let mut v = Vec::new();
        while !b.is_empty() {
            let len = (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]);
            let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]);
            v.push((b[3], b[4], stream, b[9..9 + len].to_vec()));
            b = &b[9 + len..];
        }
        v
    }

    fn authority_of(fields: &[Field]) -> Vec<u8> {
        fields
            .iter()
            .find(|f| f.name == b":authority")
            .map(|f| f.value.clone())
            .unwrap()
    }

    #[test]
    fn socket_path_authority_is_replaced_and_indexed_references_too() {
        let path = b"/var/lib/kubelet/device-plugins/gpusched-nvidia.com-gpu.sock";
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        wire.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS,
            1,
            &request_block(path, true),
        ));
        wire.extend(frame(0x0, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 0])); // DATA
        // Second request: :authority by dynamic index 62.
        wire.extend(frame(
            TYPE_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &[0x83, 0x86, 0x84, 0xbe],
        ));
        for step in [1, 7, 4096] {
            let mut r = Rewriter::new();
            let out = run(&mut r, &wire, step);
            assert_eq!(r.replaced, 2);
            let f = frames(&out);
            assert_eq!(f.len(), 4);
            assert_eq!((f[0].0, f[0].3.len()), (0x4, 0));
            assert_eq!(f[2], (0x0, FLAG_END_STREAM, 1, vec![0, 0, 0, 0, 0]));
            let mut d = Decoder::new(4096, 1 << 16);
            let h1 = d.decode(&f[1].3).unwrap();
            assert_eq!(f[1].1, FLAG_END_HEADERS);
            assert_eq!(authority_of(&h1), REPLACEMENT);
            assert_eq!(h1[2].value, b"/v1beta1.DevicePlugin/Allocate");
            let h3 = d.decode(&f[3].3).unwrap();
            assert_eq!(f[3].1, FLAG_END_HEADERS | FLAG_END_STREAM);
            assert_eq!(authority_of(&h3), REPLACEMENT);
            assert_eq!(h3[2].value, b"/");
        }
    }

    #[test]
    fn valid_authorities_pass_unchanged_and_other_forms_are_replaced() {
        for (a, keep) in [
            (&b"localhost"[..], true),
            (b"gpusched-nvidia.com-gpu.sock", true),
            (b"127.0.0.1:9400", true),
            (b"unix:///var/lib/kubelet/device-plugins/x.sock", false),
            (b"%2Fvar%2Flib%2Fkubelet%2Fx.sock", false),
            (b"", false),
        ] {
            let mut wire = PREFACE.to_vec();
            wire.extend(frame(
                TYPE_HEADERS,
                FLAG_END_HEADERS,
                1,
                &request_block(a, false),
            ));
            let mut r = Rewriter::new();
            let out = run(&mut r, &wire, 3);
            let f = frames(&out);
            let got = authority_of(&Decoder::new(4096, 1 << 16).decode(&f[0].3).unwrap());
            if keep {
                assert_eq!(got, a, "{}", String::from_utf8_lossy(a));
            } else {
                assert_eq!(got, REPLACEMENT, "{}", String::from_utf8_lossy(a));
            }
        }
    }

    #[test]
    fn padding_priority_and_continuation_are_reassembled() {
        let block = request_block(b"/tmp/x.sock", false);
        let (a, b) = block.split_at(10);
        let mut headers = vec![3u8]; // pad length
        headers.extend_from_slice(&[0x80, 0, 0, 1, 15]); // exclusive dep on 1, weight 15
        headers.extend_from_slice(a);
        headers.extend_from_slice(&[0, 0, 0]);
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
            5,
            &headers,
        ));
        wire.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 5, b));
        let mut r = Rewriter::new();
        let f = frames(&run(&mut r, &wire, 2));
        assert_eq!(f.len(), 1);
        let (ty, flags, stream, payload) = &f[0];
        assert_eq!((*ty, *stream), (TYPE_HEADERS, 5));
        assert_eq!(*flags, FLAG_PRIORITY | FLAG_END_STREAM | FLAG_END_HEADERS);
        assert_eq!(&payload[..5], &[0x80, 0, 0, 1, 15]);
        let h = Decoder::new(4096, 1 << 16).decode(&payload[5..]).unwrap();
        assert_eq!(authority_of(&h), REPLACEMENT);
    }

    #[test]
    fn large_blocks_are_split_to_the_server_frame_size() {
        let mut block = request_block(b"localhost", false);
        block.push(0x00);
        write_int(&mut block, 0, 7, 5);
        block.extend_from_slice(b"x-big");
        write_int(&mut block, 0, 7, 40_000);
        block.extend(std::iter::repeat_n(b'v', 40_000));
        let mut wire = PREFACE.to_vec();
        // The client may use frames up to 16 KiB too: send in three.
        let chunks: Vec<&[u8]> = block.chunks(16_000).collect();
        wire.extend(frame(TYPE_HEADERS, 0, 1, chunks[0]));
        wire.extend(frame(TYPE_CONTINUATION, 0, 1, chunks[1]));
        wire.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, chunks[2]));
        let mut r = Rewriter::new();
        let f = frames(&run(&mut r, &wire, 5000));
        assert!(f.len() >= 3);
        let mut all = Vec::new();
        for (i, (ty, flags, _, p)) in f.iter().enumerate() {
            assert!(p.len() <= SERVER_MAX_FRAME_SIZE as usize);
            assert_eq!(
                *ty,
                if i == 0 {
                    TYPE_HEADERS
                } else {
                    TYPE_CONTINUATION
                }
            );
            assert_eq!(flags & FLAG_END_HEADERS != 0, i == f.len() - 1);
            all.extend_from_slice(p);
        }
        let h = Decoder::new(4096, 1 << 16).decode(&all).unwrap();
        assert_eq!(h.last().unwrap().value.len(), 40_000);
    }

    #[test]
    fn hostile_framing_is_an_error_not_a_panic() {
        let cases: Vec<Vec<u8>> = vec![
            // HEADERS without END_HEADERS, then DATA.
            [frame(TYPE_HEADERS, 0, 1, &[0x83]), frame(0x0, 0, 1, &[])].concat(),
            // CONTINUATION alone.
            frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[0x83]),
            // padding longer than the frame.
            frame(TYPE_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &[9, 0x83]),
            // priority flag on a short frame.
            frame(TYPE_HEADERS, FLAG_PRIORITY | FLAG_END_HEADERS, 1, &[0, 0]),
            // HPACK garbage.
            frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0x80]),
            // a frame over the block limit.
            {
                let mut h = vec![0x01, 0x00, 0x01, TYPE_HEADERS, FLAG_END_HEADERS];
                h.extend_from_slice(&1u32.to_be_bytes());
                h
            },
        ];
        for c in cases {
            let mut input = BytesMut::from(&PREFACE[..]);
            input.extend_from_slice(&c);
            let mut out = BytesMut::new();
            assert!(Rewriter::new().feed(&mut input, &mut out).is_err(), "{c:?}");
        }
        // Not HTTP/2: passed through for h2 to refuse.
        let mut input = BytesMut::from(&b"GET / HTTP/1.1\r\n\r\n"[..]);
        let mut out = BytesMut::new();
        Rewriter::new().feed(&mut input, &mut out).unwrap();
        assert_eq!(&out[..], b"GET / HTTP/1.1\r\n\r\n");
    }
}
