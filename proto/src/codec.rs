//! The codec of nvlinkd's RPCs: prost's, with one bound before a
//! `ClientMessage` is decoded.
//!
//! A message's decoded size is not its encoded size: an empty
//! `AnnouncedFile` takes 2 bytes on the wire and a whole struct in memory, so
//! a 4 MiB `Start` of two million of them decoded to over 100 MiB (and a
//! daemon holding a few such links held gigabytes). Before decoding a
//! `ClientMessage`, its `Start`'s repeated fields are counted on the wire
//! (without allocating) and the `Start`'s [`footprint`] estimated; past
//! [`MAX_START_FOOTPRINT`] the message is refused with `RESOURCE_EXHAUSTED`
//! and never decoded. Every other message decodes as prost's codec decodes it.

use std::any::TypeId;
use std::marker::PhantomData;

use bytes::Buf;
use prost::Message;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstDecoder, ProstEncoder};

use crate::v1::{AnnouncedFile, ClientMessage, Start};

/// The most a `Start` may take in memory, decoded ([`footprint`]): twice the
/// message bound (tens of thousands of announced files).
pub const MAX_START_FOOTPRINT: usize = 2 * crate::MAX_MESSAGE_BYTES;

/// Bytes a decoded `Start` of `encoded` bytes takes with `args` arguments,
/// `env` variables and `files` announced files: its bytes, and each entry's
/// struct, twice (a vector grows by doubling).
fn estimate(encoded: usize, args: usize, env: usize, files: usize) -> usize {
    let string = std::mem::size_of::<String>();
    encoded
        .saturating_add(2 * args.saturating_mul(string))
        .saturating_add(2 * env.saturating_mul(2 * string + 16))
        .saturating_add(2 * files.saturating_mul(std::mem::size_of::<AnnouncedFile>()))
}

/// What a decoded `Start` takes in memory, as estimated before decoding.
pub fn footprint(start: &Start) -> usize {
    estimate(start.encoded_len(), start.args.len(), start.env.len(), start.files.len())
}

/// The footprint of the `Start` in an encoded `ClientMessage`, counted on the
/// wire: `Ok(None)` when the message holds no `Start`, `Err` when its fields
/// do not parse.
fn wire_footprint(mut msg: &[u8]) -> Result<Option<usize>, ()> {
    // prost merges every occurrence of the field into one `Start`: all count.
    let mut starts = Vec::new();
    while !msg.is_empty() {
        let (field, value) = next_field(&mut msg).ok_or(())?;
        if field == 1 {
            starts.push(value.ok_or(())?);
        }
    }
    if starts.is_empty() {
        return Ok(None);
    }
    counted(starts).map(Some)
}

/// The footprint of an encoded `Start` (the Watch RPC's request).
fn start_footprint(start: &[u8]) -> Result<Option<usize>, ()> {
    counted(vec![start]).map(Some)
}

/// The footprint of the `Start` made of these encoded pieces, merged.
fn counted(starts: Vec<&[u8]>) -> Result<usize, ()> {
    let (mut encoded, mut args, mut env, mut files) = (0usize, 0usize, 0usize, 0usize);
    for mut start in starts {
        encoded += start.len();
        while !start.is_empty() {
            match next_field(&mut start).ok_or(())?.0 {
                1 => args += 1,
                3 => env += 1,
                10 => files += 1,
                _ => {}
            }
        }
    }
    Ok(estimate(encoded, args, env, files))
}

/// The next field of `buf`: its number, and its bytes if length-delimited.
/// A group (wire types 3 and 4, which prost skips) is skipped whole.
fn next_field<'a>(buf: &mut &'a [u8]) -> Option<(u64, Option<&'a [u8]>)> {
    next_field_in(buf, 0)
}

fn next_field_in<'a>(buf: &mut &'a [u8], depth: usize) -> Option<(u64, Option<&'a [u8]>)> {
    let key = prost::encoding::decode_varint(buf).ok()?;
    let value = match key & 7 {
        // A group: its fields up to its end (prost's own depth limit is 100).
        3 if depth < 100 => {
            loop {
                let end = *buf;
                let end_key = prost::encoding::decode_varint(&mut &end[..]).ok()?;
                if end_key & 7 == 4 {
                    prost::encoding::decode_varint(buf).ok()?;
                    if end_key >> 3 != key >> 3 {
                        return None;
                    }
                    break;
                }
                next_field_in(buf, depth + 1)?;
            }
            None
        }
        0 => {
            prost::encoding::decode_varint(buf).ok()?;
            None
        }
        1 | 5 => {
            let n = if key & 7 == 1 { 8 } else { 4 };
            if buf.len() < n {
                return None;
            }
            buf.advance(n);
            None
        }
        2 => {
            let len = usize::try_from(prost::encoding::decode_varint(buf).ok()?).ok()?;
            if buf.len() < len {
                return None;
            }
            let (value, rest) = buf.split_at(len);
            *buf = rest;
            Some(value)
        }
        _ => return None,
    };
    Some((key >> 3, value))
}

/// prost's codec, bounded as the module docs say.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Bounded<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Bounded(ProstDecoder::default())
    }
}

/// prost's decoder, with the `Start` bound.
#[derive(Debug, Clone)]
pub struct Bounded<U>(ProstDecoder<U>);

impl<U: Message + Default + 'static> Decoder for Bounded<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // The message is whole and in one piece when the decoder runs. A
        // `Start` comes in a `ClientMessage` (Link) or alone (Watch).
        let whole = buf.chunk().len() == buf.remaining();
        let footprint = match TypeId::of::<U>() {
            t if whole && t == TypeId::of::<ClientMessage>() => Some(wire_footprint(buf.chunk())),
            t if whole && t == TypeId::of::<Start>() => Some(start_footprint(buf.chunk())),
            _ => None,
        };
        // What cannot be counted is not decoded either: no shim sends it.
        if footprint == Some(Err(())) {
            return Err(Status::invalid_argument("a malformed message (its fields do not parse)"));
        }
        if let Some(n) = footprint.and_then(|f| f.ok()).flatten().filter(|&n| n > MAX_START_FOOTPRINT) {
            return Err(Status::resource_exhausted(format!(
                "a Start message that takes {n} bytes decoded: nvlinkd takes at most {MAX_START_FOOTPRINT}"
            )));
        }
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::client_message;

    fn client(start: Start) -> Vec<u8> {
        ClientMessage { msg: Some(client_message::Msg::Start(start)) }.encode_to_vec()
    }

    #[test]
    fn the_wire_count_is_the_decoded_starts() {
        let start = Start {
            args: vec!["--arch=sm_90".into(), "a.o".into(), String::new()],
            cwd: "/w".into(),
            env: [("LIBRARY_PATH".to_owned(), "/l".to_owned())].into(),
            files: vec![AnnouncedFile::default(); 5],
            ..Default::default()
        };
        assert_eq!(wire_footprint(&client(start.clone())), Ok(Some(footprint(&start))));
        let reply = ClientMessage { msg: Some(client_message::Msg::File(Default::default())) }.encode_to_vec();
        assert_eq!(wire_footprint(&reply), Ok(None), "no Start");
        assert_eq!(wire_footprint(&[0x0a, 0x80]), Err(()), "cut short");
    }

    #[test]
    fn a_start_of_millions_of_empty_files_is_over_the_bound() {
        let start = Start { files: vec![AnnouncedFile::default(); 2_000_000], ..Default::default() };
        assert!(start.encoded_len() <= crate::MAX_MESSAGE_BYTES, "within the message bound");
        assert!(wire_footprint(&client(start)).unwrap().unwrap() > MAX_START_FOOTPRINT);
        // Split over two occurrences of the field, which prost merges.
        let split = [
            client(Start { files: vec![AnnouncedFile::default(); 2_000_000], ..Default::default() }),
            client(Start::default()),
        ]
        .concat();
        assert_eq!(
            ClientMessage::decode(&split[..]).ok().and_then(|m| match m.msg {
                Some(client_message::Msg::Start(s)) => Some(s.files.len()),
                _ => None,
            }),
            Some(2_000_000),
            "prost merges the occurrences"
        );
        assert!(wire_footprint(&split).unwrap().unwrap() > MAX_START_FOOTPRINT, "a Start split in two");
        // An unknown group (which prost skips) after it: counted all the same.
        let grouped = [
            client(Start { files: vec![AnnouncedFile::default(); 2_000_000], ..Default::default() }),
            vec![0xa3, 0x06, 0xa4, 0x06],
        ]
        .concat();
        assert!(wire_footprint(&grouped).unwrap().unwrap() > MAX_START_FOOTPRINT, "a group after it");
        assert_eq!(wire_footprint(&[0xa3, 0x06, 0xac, 0x06]), Err(()), "a group ended by another field's end");
        let alone = Start { files: vec![AnnouncedFile::default(); 2_000_000], ..Default::default() }.encode_to_vec();
        assert!(start_footprint(&alone).unwrap().unwrap() > MAX_START_FOOTPRINT, "a Start alone (Watch)");
        let many = Start {
            files: vec![AnnouncedFile { path: "/src/objects/x.o".into(), ..Default::default() }; 20_000],
            ..Default::default()
        };
        assert!(wire_footprint(&client(many)).unwrap().unwrap() < MAX_START_FOOTPRINT, "a big link's Start fits");
    }
}
