//! The spawn-backend contract (`shared/seeds/003_spawn_backend_test.rs`), kept byte for byte as
//! it was given; `rustfmt::skip` keeps the formatter from touching it.

#[rustfmt::skip]
#[path = "spawn_backend_seed.rs"]
mod spawn_backend_seed;
