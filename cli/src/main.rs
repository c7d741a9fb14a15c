//! The `fusegrad` command: its parser and parts are the `fusegrad_cli`
//! library's (`fusegrad_cli::command`), compiled there once for the
//! command, its tests and the examples.

fn main() {
    fusegrad_cli::command::main()
}
