fn main() {
    println!("isoswitch");
}
