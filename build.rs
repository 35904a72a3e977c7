//! Sets `cfg(linux_sandbox)`, the gate of the Linux-only local sandbox (bubblewrap, Landlock, seccomp,
//! `sandbox-init`, inotify, `prctl`): on for Linux targets, off elsewhere and when `ACP_SANDBOX_PORTABLE_CHECK`
//! is set, so that a Linux machine can check what a macOS build compiles of this crate (`.ci/run`).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(linux_sandbox)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=ACP_SANDBOX_PORTABLE_CHECK");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if linux && std::env::var_os("ACP_SANDBOX_PORTABLE_CHECK").is_none() {
        println!("cargo::rustc-cfg=linux_sandbox");
    }
}
