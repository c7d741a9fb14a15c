fn main() {
    println!("fusegrad");
}
