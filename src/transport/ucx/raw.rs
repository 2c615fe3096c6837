//! Safe RAII wrappers over the UCP handles: [`Context`], [`Worker`], [`Endpoint`] and
//! [`Request`]. No raw handle leaves this module; every handle is released in `Drop`.

use std::ffi::CString;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucx_sys as sys;

use crate::error::{Error, Result};

/// Text of a UCX status.
pub fn status_text(status: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string returns a pointer to a static NUL-terminated string for
    // every status value.
    unsafe { std::ffi::CStr::from_ptr(sys::ucs_status_string(status)) }.to_string_lossy().into_owned()
}

fn check(status: sys::ucs_status_t, what: &str) -> Result<()> {
    match status {
        sys::ucs_status_t::UCS_OK => Ok(()),
        s => Err(Error::Transport(format!("UCX {what}: {}", status_text(s)))),
    }
}

/// A UCP context (`ucp_context_h`) with the tag-matching feature.
pub struct Context {
    h: sys::ucp_context_h,
}

impl Context {
    /// Reads UCX's configuration from the environment (`UCX_*`), overriding `UCX_TLS` with
    /// `tls` when given.
    pub fn new(tls: Option<&str>) -> Result<Context> {
        let mut config: *mut sys::ucp_config_t = std::ptr::null_mut();
        // SAFETY: null prefix/file mean "environment only"; `config` is a valid out-pointer.
        check(unsafe { sys::ucp_config_read(std::ptr::null(), std::ptr::null(), &mut config) }, "config_read")?;
        let result = (|| {
            if let Some(tls) = tls {
                let (name, value) = (
                    CString::new("TLS").expect("no NUL"),
                    CString::new(tls).map_err(|_| Error::Config("bad UCX_TLS".into()))?,
                );
                // SAFETY: `config` was returned by ucp_config_read and is released below;
                // both strings are NUL-terminated and outlive the call.
                check(unsafe { sys::ucp_config_modify(config, name.as_ptr(), value.as_ptr()) }, "config_modify(TLS)")?;
            }
            let params = sys::ucp_params_t {
                field_mask: sys::ucp_params_field_UCP_PARAM_FIELD_FEATURES as u64,
                features: sys::ucp_feature_UCP_FEATURE_TAG as u64,
                ..Default::default()
            };
            let mut h: sys::ucp_context_h = std::ptr::null_mut();
            // SAFETY: `params` and `config` are valid for the call; ucp_init is a static
            // inline wrapper of ucp_init_version with the header's API version.
            check(
                unsafe { sys::ucp_init_version(sys::UCP_API_MAJOR, sys::UCP_API_MINOR, &params, config, &mut h) },
                "init",
            )?;
            Ok(Context { h })
        })();
        // SAFETY: `config` came from ucp_config_read and is not used after this.
        unsafe { sys::ucp_config_release(config) };
        result
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `h` is a live context; every worker holds an Rc to the context, so none
        // outlives it.
        unsafe { sys::ucp_cleanup(self.h) }
    }
}

/// A UCP worker (`ucp_worker_h`), single-threaded.
pub struct Worker {
    h: sys::ucp_worker_h,
    _context: Rc<Context>,
}

impl Worker {
    /// Creates a worker on `context`.
    pub fn new(context: Rc<Context>) -> Result<Rc<Worker>> {
        let params = sys::ucp_worker_params_t {
            field_mask: sys::ucp_worker_params_field_UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
            thread_mode: sys::ucs_thread_mode_t_UCS_THREAD_MODE_SINGLE,
            ..Default::default()
        };
        let mut h: sys::ucp_worker_h = std::ptr::null_mut();
        // SAFETY: `context.h` is live (held by the Rc); `params` is valid for the call.
        check(unsafe { sys::ucp_worker_create(context.h, &params, &mut h) }, "worker_create")?;
        Ok(Rc::new(Worker { h, _context: context }))
    }

    /// The worker's address, to publish to peers.
    pub fn address(&self) -> Result<Vec<u8>> {
        let mut addr: *mut sys::ucp_address_t = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: `h` is live; out-pointers are valid.
        check(unsafe { sys::ucp_worker_get_address(self.h, &mut addr, &mut len) }, "worker_get_address")?;
        // SAFETY: UCX returned `len` readable bytes at `addr`; they are copied before release.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: `addr` was returned by ucp_worker_get_address on this worker.
        unsafe { sys::ucp_worker_release_address(self.h, addr) };
        Ok(bytes)
    }

    /// Drives communication; returns whether anything happened.
    pub fn progress(&self) -> bool {
        // SAFETY: `h` is live and used from this thread only (thread mode single).
        unsafe { sys::ucp_worker_progress(self.h) != 0 }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // SAFETY: endpoints and requests hold an Rc to the worker, so none outlives it.
        unsafe { sys::ucp_worker_destroy(self.h) }
    }
}

/// Records the first error UCX reports for an endpoint (peer failure).
unsafe extern "C" fn on_endpoint_error(arg: *mut std::ffi::c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    // SAFETY: `arg` is the `Box<Cell<..>>` owned by the Endpoint, which outlives its handle
    // (the handle is closed in Endpoint::drop before the box is freed).
    let cell = unsafe { &*(arg as *const std::cell::Cell<Option<sys::ucs_status_t>>) };
    if cell.get().is_none() {
        cell.set(Some(status));
    }
}

/// An endpoint to one peer's worker, with peer-failure reporting.
pub struct Endpoint {
    h: sys::ucp_ep_h,
    worker: Rc<Worker>,
    error: Box<std::cell::Cell<Option<sys::ucs_status_t>>>,
}

impl Endpoint {
    /// Connects to the worker whose address is `address`. With `peer_errors`, UCX reports
    /// peer failures on this endpoint (error handling mode PEER); UCX then only selects
    /// transports that support it, which excludes shared memory (posix, sysv, cma).
    pub fn connect(worker: Rc<Worker>, address: &[u8], peer_errors: bool) -> Result<Endpoint> {
        let error = Box::new(std::cell::Cell::new(None));
        let params = sys::ucp_ep_params_t {
            field_mask: (sys::ucp_ep_params_field_UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                | sys::ucp_ep_params_field_UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::ucp_ep_params_field_UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64,
            address: address.as_ptr() as *const sys::ucp_address_t,
            err_mode: if peer_errors {
                sys::ucp_err_handling_mode_t_UCP_ERR_HANDLING_MODE_PEER
            } else {
                sys::ucp_err_handling_mode_t_UCP_ERR_HANDLING_MODE_NONE
            },
            err_handler: sys::ucp_err_handler_t {
                cb: Some(on_endpoint_error),
                arg: &*error as *const _ as *mut std::ffi::c_void,
            },
            ..Default::default()
        };
        let mut h: sys::ucp_ep_h = std::ptr::null_mut();
        // SAFETY: the worker is live; `address` holds a worker address received from the
        // peer and outlives the call (UCX copies what it needs); the error cell's address is
        // stable (boxed) and lives as long as the endpoint.
        check(unsafe { sys::ucp_ep_create(worker.h, &params, &mut h) }, "ep_create")?;
        Ok(Endpoint { h, worker, error })
    }

    /// The failure UCX reported for this peer, if any.
    pub fn failure(&self) -> Option<String> {
        self.error.get().map(status_text)
    }

    /// Posts a tagged send of `buf`.
    ///
    /// # Safety
    /// `buf` must stay alive and unmodified until the returned request completes (or the
    /// process exits).
    pub unsafe fn send(&self, buf: &[u8], tag: u64) -> Result<Request> {
        let param = sys::ucp_request_param_t::default();
        // SAFETY: the endpoint and worker are live; the caller keeps `buf` alive until the
        // request completes.
        let ptr = unsafe { sys::ucp_tag_send_nbx(self.h, buf.as_ptr() as *const _, buf.len(), tag, &param) };
        Request::from_status_ptr(ptr, &self.worker, "tag_send")
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let param = sys::ucp_request_param_t {
            op_attr_mask: sys::ucp_op_attr_t_UCP_OP_ATTR_FIELD_FLAGS,
            flags: sys::ucp_ep_close_flags_t_UCP_EP_CLOSE_FLAG_FORCE,
            ..Default::default()
        };
        // SAFETY: `h` is live; a forced close cancels outstanding operations. The returned
        // request (if any) is driven to completion and freed below.
        let ptr = unsafe { sys::ucp_ep_close_nbx(self.h, &param) };
        if let Ok(req) = Request::from_status_ptr(ptr, &self.worker, "ep_close") {
            let _ = req.wait(Instant::now() + Duration::from_secs(2));
        }
    }
}

/// A posted operation. Dropping a request that has not completed cancels it and drives it
/// to completion, so that UCX never touches its buffer afterwards.
pub struct Request {
    ptr: *mut std::ffi::c_void,
    worker: Rc<Worker>,
}

impl Request {
    fn from_status_ptr(ptr: sys::ucs_status_ptr_t, worker: &Rc<Worker>, what: &str) -> Result<Request> {
        if sys::ucs_ptr_is_err(ptr) {
            return Err(Error::Transport(format!("UCX {what}: {}", status_text(sys::ucs_ptr_status(ptr)))));
        }
        // NULL means the operation completed immediately.
        Ok(Request { ptr, worker: worker.clone() })
    }

    /// `Ok(true)` when complete, `Ok(false)` while in progress, `Err` on failure.
    pub fn test(&self) -> Result<bool> {
        if self.ptr.is_null() {
            return Ok(true);
        }
        // SAFETY: `ptr` is a live request handle (freed only in Drop).
        match unsafe { sys::ucp_request_check_status(self.ptr) } {
            sys::ucs_status_t::UCS_INPROGRESS => Ok(false),
            sys::ucs_status_t::UCS_OK => Ok(true),
            s => Err(Error::Transport(status_text(s))),
        }
    }

    /// Progresses the worker until the request completes or `deadline` passes.
    pub fn wait(self, deadline: Instant) -> Result<()> {
        loop {
            if self.test()? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Transport("timed out".into()));
            }
            self.worker.progress();
        }
    }

    /// Posts a tagged receive into `buf` on `worker`.
    ///
    /// # Safety
    /// `buf` must stay alive and not be read or written until the request completes (or
    /// the process exits).
    pub unsafe fn recv(worker: &Rc<Worker>, buf: &mut [u8], tag: u64) -> Result<Request> {
        let param = sys::ucp_request_param_t::default();
        // SAFETY: the worker is live; the caller keeps `buf` alive until completion.
        let ptr =
            unsafe { sys::ucp_tag_recv_nbx(worker.h, buf.as_mut_ptr() as *mut _, buf.len(), tag, u64::MAX, &param) };
        Request::from_status_ptr(ptr, worker, "tag_recv")
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: `ptr` is a live request of this worker.
        if unsafe { sys::ucp_request_check_status(self.ptr) } == sys::ucs_status_t::UCS_INPROGRESS {
            // SAFETY: cancelling a live request is allowed; it then completes with
            // UCS_ERR_CANCELED after progress.
            unsafe { sys::ucp_request_cancel(self.worker.h, self.ptr) };
            let deadline = Instant::now() + Duration::from_secs(2);
            // SAFETY: as above, `ptr` stays live until freed below.
            while unsafe { sys::ucp_request_check_status(self.ptr) } == sys::ucs_status_t::UCS_INPROGRESS {
                if Instant::now() > deadline {
                    // UCX may still use the buffer: the only safe way out is to stop the
                    // process before the buffer is freed or reused.
                    eprintln!("meshfeed: error: a UCX request could not be cancelled; exiting");
                    std::process::exit(1);
                }
                self.worker.progress();
            }
        }
        // SAFETY: the request has completed; it is freed exactly once.
        unsafe { sys::ucp_request_free(self.ptr) };
    }
}
