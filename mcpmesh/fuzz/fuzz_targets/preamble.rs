//! The session preamble: any line parses or is refused, never panics; a parsed one names a
//! valid service.

#![forbid(unsafe_code)]
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcpmesh_net::session::{Preamble, valid_service_name};

fuzz_target!(|line: &[u8]| {
    if let Ok(p) = Preamble::parse(line) {
        assert!(valid_service_name(&p.service));
        assert_eq!(
            Preamble::parse(&p.to_line()[..p.to_line().len() - 1]),
            Ok(p)
        );
    }
});
