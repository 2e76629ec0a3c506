//! RoCEv2 (RDMA over Converged Ethernet v2), sans I/O and allocation-free: the headers an RC
//! queue pair's RDMA WRITE, SEND and ACK/NAK packets carry ([`headers`]), a whole packet as it
//! sits in a UDP datagram to port 4791 ([`packet`]), the invariant CRC that ends it
//! ([`icrc`]), and the Ethernet/IPv4/UDP headers a raw sender puts in front ([`frame`]). Layouts: docs/formats.md section 5 (from Linux `ib_pack.h` and the
//! software RoCE driver); the protocol in docs/protocol.md.

pub mod frame;
pub mod headers;
pub mod icrc;
pub mod packet;

pub use headers::{Aeth, AethKind, Bth, Opcode, Reth, AETH_LEN, BTH_LEN, IMMDT_LEN, RETH_LEN, ROCE_PORT};
pub use frame::{parse_headers, write_frame, write_headers, Endpoints, FrameHeaders, FRAME_HEADERS_LEN};
pub use icrc::{icrc_ipv4, icrc_ipv4_parts, icrc_ipv6, ICRC_LEN};
pub use packet::{encode, encoded_len, parse, parse_head, seal_ipv4, Head, Headers, Packet, RoceError, MAX_HEAD};
