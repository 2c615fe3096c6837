//! A build without the `ucx` feature: no UCX link is ever made, and every answer travels
//! over its connection.

use crate::error::{Error, Result};

/// No answer is large enough to go over UCX.
pub const MIN_BYTES: usize = usize::MAX;

/// A UCX link, of which this build has none.
pub enum Link {}

impl Link {
    pub fn new() -> Result<(Link, Vec<u8>)> {
        Err(Error::Config("this meshfeed was built without UCX (the `ucx` feature)".into()))
    }

    pub fn connect(&mut self, _address: &[u8]) -> Result<()> {
        match *self {}
    }

    pub fn send(
        &self,
        _payload: Vec<u8>,
        _tag: u64,
        _waiting: &mut dyn FnMut() -> bool,
    ) -> std::result::Result<(), (super::wire::WireError, Option<Vec<u8>>)> {
        match *self {}
    }

    pub fn recv(
        &self,
        _len: usize,
        _tag: u64,
        _timeout: std::time::Duration,
        _waiting: &mut dyn FnMut() -> bool,
    ) -> std::result::Result<Vec<u8>, super::wire::WireError> {
        match *self {}
    }
}
