//! The library's unit tests (beside its code, compiled into it with the
//! `selftest` feature): `cargo test --release --test unit [-- FILTER]`.

fn main() -> std::process::ExitCode {
    fusegrad::selftest::main()
}
