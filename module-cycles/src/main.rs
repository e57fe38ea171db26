//! `module-cycles DIR..`: prints the report of each package folder and
//! exits 1 when any has a cycle (2 when one cannot be read).

fn main() {
    let dirs: Vec<String> = std::env::args().skip(1).collect();
    if dirs.is_empty() {
        eprintln!("usage: module-cycles PACKAGE_DIR..");
        std::process::exit(2);
    }
    let mut status = 0;
    for dir in dirs {
        match module_cycles::check_package(std::path::Path::new(&dir)) {
            Ok(report) => {
                print!("{report}");
                if !report.cycles.is_empty() {
                    status = status.max(1);
                }
            }
            Err(e) => {
                eprintln!("module-cycles: {e}");
                status = 2;
            }
        }
    }
    std::process::exit(status);
}
