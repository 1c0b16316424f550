//! The `:authority` layer on hand-built HTTP/2 frames: what C-core, Java
//! and old kubelet clients send, split at every byte boundary, and hostile
//! input.

use super::rewrite::*;
use bytes::BytesMut;
use loona_hpack::Decoder;
use loona_hpack::encoder::encode_integer_into;

/// `/var/lib/kubelet/device-plugins/gpusched-nvidia.com-gpu.sock`
/// Huffman-coded (RFC 7541 Appendix B), as C-core clients send strings.
const HUFFMAN_SOCKET_PATH: &str =
    "63b8ec628346c75b632d054b1217b98855aba2d98d52189abb5049cb22d57734861ae43d2b4d5daba0e4eb";
const SOCKET_PATH: &[u8] = b"/var/lib/kubelet/device-plugins/gpusched-nvidia.com-gpu.sock";

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Writes an integer with an `n`-bit prefix whose high bits are `flags`.
fn write_int(out: &mut Vec<u8>, flags: u8, n: u8, v: usize) {
    encode_integer_into(v, n, flags, out).unwrap();
}

/// A decoder as the server has one (h2's defaults).
fn decoder() -> Decoder<'static> {
    let mut d = Decoder::new();
    d.set_max_allowed_table_size(4096);
    d
}

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
        assert_eq!(authority, SOCKET_PATH, "the one Huffman-coded fixture");
        let h = hex(HUFFMAN_SOCKET_PATH);
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

fn authority_of(fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    fields
        .iter()
        .find(|f| f.0 == b":authority")
        .map(|f| f.1.clone())
        .unwrap()
}

#[test]
fn socket_path_authority_is_replaced_and_indexed_references_too() {
    let path = SOCKET_PATH;
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
        let mut d = decoder();
        let h1 = d.decode(&f[1].3).unwrap();
        assert_eq!(f[1].1, FLAG_END_HEADERS);
        assert_eq!(authority_of(&h1), REPLACEMENT);
        assert_eq!(h1[2].1, b"/v1beta1.DevicePlugin/Allocate");
        let h3 = d.decode(&f[3].3).unwrap();
        assert_eq!(f[3].1, FLAG_END_HEADERS | FLAG_END_STREAM);
        assert_eq!(authority_of(&h3), REPLACEMENT);
        assert_eq!(h3[2].1, b"/");
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
        let got = authority_of(&decoder().decode(&f[0].3).unwrap());
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
    let h = decoder().decode(&payload[5..]).unwrap();
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
    let h = decoder().decode(&all).unwrap();
    assert_eq!(h.last().unwrap().1.len(), 40_000);
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

#[test]
fn huffman_fixture_is_the_socket_path() {
    let got = loona_hpack::huffman::HuffmanDecoder::new()
        .decode(&hex(HUFFMAN_SOCKET_PATH))
        .unwrap();
    assert_eq!(got, SOCKET_PATH);
}

#[test]
fn literal_encoding_decodes_back_without_touching_the_table() {
    let fields = vec![
        (b":method".to_vec(), b"POST".to_vec()),
        (b":authority".to_vec(), b"localhost".to_vec()),
        (b"x-long".to_vec(), vec![b'a'; 300]),
    ];
    let block = encode_literal(&fields);
    let mut d = decoder();
    assert_eq!(d.decode(&block).unwrap(), fields);
    // Nothing was added to the dynamic table: index 62 does not exist.
    assert!(d.decode(&[0xbe]).is_err());
}

#[test]
fn hostile_hpack_is_an_error_not_a_panic() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("index 0", vec![0x80]),
        ("dynamic index never inserted", vec![0xbe]),
        ("truncated integer", vec![0xff, 0xff]),
        (
            "integer over five octets",
            vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        ),
        ("string past the block", vec![0x00, 0x05, b'a']),
        // Huffman "a" (00011) padded with zeros instead of EOS ones.
        ("bad huffman padding", vec![0x00, 0x81, 0x18, 0x00]),
        ("table size over the limit", {
            let mut b = Vec::new();
            write_int(&mut b, 0x20, 5, 4097);
            b.push(0x82);
            b
        }),
        ("size update at the end", vec![0x82, 0x20]),
        ("list over the limit", {
            // One 4 KiB entry, then references to it past 64 KiB.
            let mut b = vec![0x40, 0x01, b'x'];
            write_int(&mut b, 0, 7, 4000);
            b.extend(std::iter::repeat_n(b'v', 4000));
            b.extend(std::iter::repeat_n(0xbe, 20));
            b
        }),
    ];
    for (what, block) in cases {
        let mut input = BytesMut::from(&PREFACE[..]);
        input.extend_from_slice(&frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &block));
        let mut out = BytesMut::new();
        let r = Rewriter::new().feed(&mut input, &mut out);
        assert!(r.is_err(), "{what}: {r:?}");
    }
}
