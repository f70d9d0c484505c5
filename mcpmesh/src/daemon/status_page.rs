//! Where the status page is kept once it is open, and what opening it takes.

use std::path::PathBuf;

use crate::web::StatusPage;

/// The status page, once it is open, and what opening it takes.
#[derive(Debug)]
pub(in crate::daemon) struct StatusPageSlot {
    pub(super) token_file: PathBuf,
    pub(super) audit_dir: PathBuf,
    pub(super) page: tokio::sync::Mutex<Option<StatusPage>>,
}

impl StatusPageSlot {
    pub(in crate::daemon) fn new(token_file: PathBuf, audit_dir: PathBuf) -> Self {
        StatusPageSlot {
            token_file,
            audit_dir,
            page: Default::default(),
        }
    }
}
