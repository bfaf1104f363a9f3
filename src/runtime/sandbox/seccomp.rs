//! The box's seccomp filter, as the classic BPF program `bwrap --seccomp FD` installs after the box is
//! built: the calls that would widen or leave the box fail with `EPERM` (new mounts, new namespaces,
//! tracing, kernel modules, the keyring, BPF), `clone3` fails with `ENOSYS` so the C library falls back to
//! `clone` (whose flags a classic filter can read), and a `clone` asking for a new namespace fails.
//! Everything else is allowed. Hand-written: a deny list is a dozen instructions, the same set Docker's
//! and Flatpak's default profiles refuse, and a library would cost more than it saves.

// Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h): fixed kernel ABI.
const LD_W_ABS: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20)
const JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
const JSET_K: u16 = 0x05 | 0x40; // BPF_JMP | BPF_JSET | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K
const ALLOW: u32 = 0x7fff_0000;
const KILL_PROCESS: u32 = 0x8000_0000;
const ERRNO: u32 = 0x0005_0000;

// struct seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low 32 bits first on little-endian).
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0_LOW: u32 = 16;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Every namespace flag `clone` and `unshare` take (CLONE_NEWNS .. CLONE_NEWTIME).
const CLONE_NEW_ANY: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | 0x80) as u32; // CLONE_NEWTIME

/// The calls refused with `EPERM` inside the box.
pub fn refused() -> Vec<(&'static str, libc::c_long)> {
    let mut calls = vec![
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fspick", libc::SYS_fspick),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("keyctl", libc::SYS_keyctl),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("reboot", libc::SYS_reboot),
        ("syslog", libc::SYS_syslog),
        ("acct", libc::SYS_acct),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([("iopl", libc::SYS_iopl), ("ioperm", libc::SYS_ioperm)]);
    calls
}

/// The filter, as the bytes of a `struct sock_filter` array in native byte order.
pub fn program() -> Vec<u8> {
    let refused = refused();
    // Instructions: [0] load arch, [1] arch check, [2] load nr, [3] x32 check, then one jump per refused
    // call, then clone3, clone (and its flags), then the returns.
    let mut code: Vec<(u16, u8, u8, u32)> = Vec::new();
    let n = refused.len();
    // Index of the returns, counted from the instruction after the refused list.
    // Layout after the list: [c3] jeq clone3, [cl] jeq clone, [ok] ret allow, [ld] load arg0,
    // [js] jset ns, [ok2] ret allow, [enosys] ret, [eperm] ret, [kill] ret.
    let list_end = 4 + n; // index of the clone3 test
    let load_arg = list_end + 3;
    let enosys = list_end + 6;
    let eperm = list_end + 7;
    let kill = list_end + 8;
    let jump = |from: usize, to: usize| (to - from - 1) as u8;
    code.push((LD_W_ABS, 0, 0, ARCH));
    code.push((JEQ_K, 0, jump(1, kill), AUDIT_ARCH));
    code.push((LD_W_ABS, 0, 0, NR));
    // x86_64's x32 calls are the same calls with bit 30 set: refuse them all rather than list them twice.
    code.push((JGE_K, jump(3, eperm), 0, 0x4000_0000));
    for (i, (_, nr)) in refused.iter().enumerate() {
        let at = 4 + i;
        code.push((JEQ_K, jump(at, eperm), 0, *nr as u32));
    }
    code.push((JEQ_K, jump(list_end, enosys), 0, libc::SYS_clone3 as u32));
    code.push((JEQ_K, jump(list_end + 1, load_arg), 0, libc::SYS_clone as u32));
    code.push((RET_K, 0, 0, ALLOW));
    code.push((LD_W_ABS, 0, 0, ARG0_LOW));
    code.push((JSET_K, jump(load_arg + 1, eperm), 0, CLONE_NEW_ANY));
    code.push((RET_K, 0, 0, ALLOW));
    code.push((RET_K, 0, 0, ERRNO | libc::ENOSYS as u32));
    code.push((RET_K, 0, 0, ERRNO | libc::EPERM as u32));
    code.push((RET_K, 0, 0, KILL_PROCESS));
    debug_assert_eq!(code.len(), kill + 1);
    let mut bytes = Vec::with_capacity(code.len() * 8);
    for (op, jt, jf, k) in code {
        bytes.extend_from_slice(&op.to_ne_bytes());
        bytes.push(jt);
        bytes.push(jf);
        bytes.extend_from_slice(&k.to_ne_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    /// The jumps land inside the program and every path ends in a return.
    #[test]
    fn the_program_is_well_formed() {
        let bytes = super::program();
        assert_eq!(bytes.len() % 8, 0);
        let code: Vec<(u16, u8, u8)> = bytes
            .chunks(8)
            .map(|c| (u16::from_ne_bytes([c[0], c[1]]), c[2], c[3]))
            .collect();
        for (i, (op, jt, jf)) in code.iter().enumerate() {
            if op & 0x07 == 0x05 {
                assert!(i + 1 + (*jt as usize) < code.len(), "jt of {i} lands outside");
                assert!(i + 1 + (*jf as usize) < code.len(), "jf of {i} lands outside");
            }
        }
        assert_eq!(code.last().unwrap().0, super::RET_K);
    }
}
