//! Worker addresses as ranks publish them: framed by meshfeed, and checked before UCX
//! parses them.
//!
//! UCX parses a worker address (in `ucp_ep_create`) without being told its length and
//! trusts every length and flag inside it: on a malformed address UCX 1.13 fails an
//! assertion (abort) or reads past the buffer. Addresses come from other processes (over
//! the rendezvous, where only the job token vouches for them), so each is checked first,
//! and a bad one fails the job with an error naming the rank that published it:
//!
//! * **The frame** ([`frame`]): magic, frame version, the sender's UCX version, the
//!   address length and a CRC-32 of the address. It rejects a payload that is not a
//!   meshfeed worker address at all (another program speaking the rendezvous protocol,
//!   another meshfeed version), and a truncated or mangled one.
//! * **The UCX header** ([`check_peer`]): byte 0 holds the address format version (low 4
//!   bits) and flags (high 4 bits: debug info, worker uuid, client id, AM only); the uuid
//!   and client id, when flagged, follow as 8 bytes each. The version must equal the one
//!   of this rank's own address (UCX 1.13 aborts on a version it does not know), the
//!   flagged fields must be there, and the uuid must not be this rank's own.
//! * **The table** ([`check_table`]): no two ranks may publish the same address.
//!
//! What stays unchecked is the body (device and transport entries): its layout depends on
//! the UCX version and configuration and is private to UCX. A process that holds the job
//! token and deliberately frames a malformed body can still crash UCX: the token is the
//! trust boundary.

/// Frame layout: magic | frame version u8 | UCX major u16 | UCX minor u16 | length u32 |
/// CRC-32 u32 | address.
const MAGIC: &[u8; 4] = b"MFWA";
const FRAME_VERSION: u8 = 1;
const FRAME_HEADER: usize = 4 + 1 + 2 + 2 + 4 + 4;
/// The longest worker address accepted. Addresses are a few hundred bytes per network
/// device; this leaves room for hosts with dozens of devices.
pub const MAX_ADDRESS: usize = 64 << 10;

/// The UCX address header (UCX 1.13: `ucp_address.c`).
const UCX_VERSION_MASK: u8 = 0x0f;
const UCX_FLAG_WORKER_UUID: u8 = 0x20;
const UCX_FLAG_CLIENT_ID: u8 = 0x40;

/// `address` (this rank's worker address) framed for publishing; `ucx` is the (major,
/// minor) version of the UCX library this process uses.
pub fn frame(address: &[u8], ucx: (u32, u32)) -> Vec<u8> {
    let mut m = Vec::with_capacity(FRAME_HEADER + address.len());
    m.extend_from_slice(MAGIC);
    m.push(FRAME_VERSION);
    m.extend_from_slice(&(ucx.0.min(u16::MAX as u32) as u16).to_le_bytes());
    m.extend_from_slice(&(ucx.1.min(u16::MAX as u32) as u16).to_le_bytes());
    m.extend_from_slice(&(address.len() as u32).to_le_bytes());
    m.extend_from_slice(&crc32fast::hash(address).to_le_bytes());
    m.extend_from_slice(address);
    m
}

/// A published worker address and the UCX version its publisher reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published<'a> {
    pub address: &'a [u8],
    pub ucx: (u32, u32),
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// What is wrong with a worker address another rank published: its frame ([`unframe`]),
/// its UCX header against this rank's ([`check_peer`]), or the table ([`check_table`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// No meshfeed frame: `len` bytes, the first of them `shown` (printable ones).
    #[error(
        "not a meshfeed worker address ({len} bytes starting {shown:?}; another program, or another meshfeed version?)"
    )]
    NotFramed { len: usize, shown: String },
    /// A frame of another version.
    #[error("frame version {0} (expected {FRAME_VERSION}: another meshfeed version?)")]
    FrameVersion(u8),
    /// An address longer than any accepted.
    #[error("{0} bytes long, more than the {MAX_ADDRESS} accepted")]
    TooLong(usize),
    /// A frame whose address is not the length it announces.
    #[error("announces {announced} bytes but carries {carried} (truncated?)")]
    Truncated { announced: usize, carried: usize },
    /// A frame whose checksum does not match its address.
    #[error("its CRC-32 does not match (corrupted in transit or by the sender)")]
    Crc,
    /// An empty address (this rank's or the peer's).
    #[error("empty")]
    Empty,
    /// A UCX address format version other than this rank's UCX uses; the UCX versions
    /// (major, minor) of both ranks, for the message.
    #[error(
        "address format version {theirs}, but this rank's UCX {}.{} uses version {ours} \
         (the publisher reports UCX {}.{}; run one UCX version on every rank)",
        own_ucx.0, own_ucx.1, peer_ucx.0, peer_ucx.1
    )]
    FormatVersion { theirs: u8, ours: u8, own_ucx: (u32, u32), peer_ucx: (u32, u32) },
    /// An address shorter than its UCX header (`flags`) announces.
    #[error("{len} bytes, shorter than the {need} its header (0x{flags:02x}) announces")]
    Short { len: usize, need: usize, flags: u8 },
    /// This rank's own worker, published by another.
    #[error("it names this rank's own worker (same worker uuid)")]
    OwnWorker,
    /// The address another rank (world rank given) published too.
    #[error("the same address as rank {0}")]
    SameAs(usize),
}

/// The address inside a frame another rank published; `Err` says what is wrong with it.
pub fn unframe(framed: &[u8]) -> Result<Published<'_>, AddressError> {
    if framed.len() < FRAME_HEADER || &framed[..4] != MAGIC {
        let shown: String =
            framed.iter().take(8).map(|&b| if b.is_ascii_graphic() { b as char } else { '.' }).collect();
        return Err(AddressError::NotFramed { len: framed.len(), shown });
    }
    if framed[4] != FRAME_VERSION {
        return Err(AddressError::FrameVersion(framed[4]));
    }
    let ucx = (u16_at(framed, 5) as u32, u16_at(framed, 7) as u32);
    let len = u32_at(framed, 9) as usize;
    let body = &framed[FRAME_HEADER..];
    if len > MAX_ADDRESS {
        return Err(AddressError::TooLong(len));
    }
    if body.len() != len {
        return Err(AddressError::Truncated { announced: len, carried: body.len() });
    }
    if crc32fast::hash(body) != u32_at(framed, 13) {
        return Err(AddressError::Crc);
    }
    Ok(Published { address: body, ucx })
}

/// Checks `peer` (another rank's address, published with UCX version `peer_ucx`) against
/// `own` (this rank's, from UCX `own_ucx`) as far as UCX's header goes.
pub fn check_peer(own: &[u8], own_ucx: (u32, u32), peer: &[u8], peer_ucx: (u32, u32)) -> Result<(), AddressError> {
    let version = |a: &[u8]| a.first().map(|b| b & UCX_VERSION_MASK);
    let (Some(ours), Some(theirs)) = (version(own), version(peer)) else {
        return Err(AddressError::Empty);
    };
    if theirs != ours {
        return Err(AddressError::FormatVersion { theirs, ours, own_ucx, peer_ucx });
    }
    // The header, the uuid and the client id where flagged, and at least one byte of the
    // device list (or its empty marker).
    let flags = peer[0];
    let uuid = flags & UCX_FLAG_WORKER_UUID != 0;
    let need = 1 + 8 * usize::from(uuid) + 8 * usize::from(flags & UCX_FLAG_CLIENT_ID != 0) + 1;
    if peer.len() < need {
        return Err(AddressError::Short { len: peer.len(), need, flags });
    }
    if uuid && own.first().is_some_and(|b| b & UCX_FLAG_WORKER_UUID != 0) && own.len() >= 9 && peer[1..9] == own[1..9] {
        return Err(AddressError::OwnWorker);
    }
    Ok(())
}

/// Checks every address of a group against the others: `addresses[i]` was published by
/// world rank `ranks[i]`; `me` is this rank's index. `Err` names the rank at fault.
pub fn check_table(
    addresses: &[&[u8]],
    ucx: &[(u32, u32)],
    ranks: &[usize],
    me: usize,
) -> Result<(), (usize, AddressError)> {
    let own = addresses[me];
    for (i, peer) in addresses.iter().enumerate() {
        if i == me {
            continue;
        }
        check_peer(own, ucx[me], peer, ucx[i]).map_err(|why| (ranks[i], why))?;
        if let Some(j) = (0..i).find(|&j| addresses[j] == *peer) {
            return Err((ranks[i], AddressError::SameAs(ranks[j])));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shaped like a UCX 1.13 address here: header 0x20 (format 0, worker uuid), uuid,
    /// then device entries.
    fn address(uuid: u8) -> Vec<u8> {
        let mut a = vec![0x20];
        a.extend([uuid; 8]);
        a.extend([0x20, 0x00, 0x63, 0x75, 0x77, 0xcc, 0x2b, 0x32]);
        a
    }

    const UCX: (u32, u32) = (1, 13);

    #[test]
    fn frames_round_trip_and_reject_damage() {
        let a = address(1);
        let f = frame(&a, UCX);
        assert_eq!(unframe(&f), Ok(Published { address: &a, ucx: UCX }));
        let err = |f: &[u8]| unframe(f).unwrap_err().to_string();
        assert!(err(b"").contains("not a meshfeed worker address (0 bytes"));
        assert!(err(&a).contains("not a meshfeed worker address"), "a bare UCX address has no frame");
        assert!(err(&[0xde, 0xad, 0xbe, 0xef].repeat(10)).contains("not a meshfeed worker address"));
        let mut v = f.clone();
        v[4] = 9;
        assert!(err(&v).contains("frame version 9"));
        assert!(err(&f[..f.len() - 1]).contains("truncated"));
        let mut long = f.clone();
        long.push(0);
        assert!(err(&long).contains("announces 17 bytes but carries 18"));
        let mut flipped = f.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(err(&flipped).contains("CRC-32"));
        let mut huge = f.clone();
        huge[9..13].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(err(&huge).contains("more than the 65536 accepted"));
    }

    #[test]
    fn the_ucx_header_is_checked_against_our_own() {
        let own = address(1);
        assert_eq!(check_peer(&own, UCX, &address(2), UCX), Ok(()));
        // An unknown format version (UCX 1.13 aborts on it).
        let mut v = address(2);
        v[0] = 0x2a;
        let e = check_peer(&own, UCX, &v, (1, 99)).unwrap_err().to_string();
        assert!(e.contains("format version 10") && e.contains("UCX 1.99"), "{e}");
        // Shorter than the header announces: uuid and client id flagged.
        assert!(check_peer(&own, UCX, &[0x20, 1, 2, 3], UCX).unwrap_err().to_string().contains("shorter than the 10"));
        let mut client = address(2);
        client[0] |= UCX_FLAG_CLIENT_ID;
        assert!(check_peer(&own, UCX, &client, UCX).unwrap_err().to_string().contains("shorter than the 18"));
        assert!(check_peer(&own, UCX, &[], UCX).unwrap_err().to_string().contains("empty"));
        // Our own worker, published by someone else.
        assert!(check_peer(&own, UCX, &address(1), UCX).unwrap_err().to_string().contains("this rank's own worker"));
    }

    #[test]
    fn every_rank_publishes_its_own_address() {
        let (a, b, c) = (address(1), address(2), address(3));
        let ucx = [UCX; 3];
        assert_eq!(check_table(&[&a, &b, &c], &ucx, &[0, 1, 2], 0), Ok(()));
        let (rank, why) = check_table(&[&a, &b, &b], &ucx, &[4, 5, 6], 0).unwrap_err();
        assert_eq!(rank, 6);
        assert_eq!(why, AddressError::SameAs(5));
        assert!(why.to_string().contains("the same address as rank 5"), "{why}");
        let (rank, _) = check_table(&[&a, &[0x2f, 0][..], &c], &ucx, &[0, 1, 2], 2).unwrap_err();
        assert_eq!(rank, 1);
    }
}
