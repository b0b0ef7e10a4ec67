//! Run-as mapping: a root service runs a token's transfers as the local account the token is
//! mapped to (`tern token create --run-as USER`), so the kernel's permissions decide what the
//! job can read and write, as Globus' identity mapping does.

use std::ffi::{CStr, CString};

/// A local account, resolved before the fork (getpwnam is not async-signal-safe).
#[derive(Debug, Clone)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
    pub home: String,
}

pub fn is_root() -> bool {
    // SAFETY: plain syscall.
    unsafe { libc::geteuid() == 0 }
}

/// A user name as useradd accepts it: no path, shell or option characters can ride along.
pub fn valid_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty() && name.len() <= 32 && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) && !name.starts_with('-');
    if ok { Ok(()) } else { Err(format!("run-as user '{name}' is not a valid account name")) }
}

/// Looks `name` up in the system's user database, with its supplementary groups.
pub fn lookup(name: &str) -> Result<Account, String> {
    valid_name(name)?;
    let cname = CString::new(name).map_err(|_| format!("run-as user '{name}' is not a valid account name"))?;
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0u8; 16 * 1024];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: buffers are valid for their lengths; `out` points into `pw` on success.
    let rc = unsafe { libc::getpwnam_r(cname.as_ptr(), &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return Err(format!("run-as user '{name}' does not exist on the service's host; create it or map the token to another account"));
    }
    // SAFETY: getpwnam_r filled these with NUL-terminated strings in `buf`.
    let home = unsafe { CStr::from_ptr(pw.pw_dir) }.to_string_lossy().into_owned();
    let mut n: libc::c_int = 64;
    let mut groups: Vec<libc::gid_t> = vec![0; n as usize];
    loop {
        // SAFETY: `groups` holds `n` entries; on -1 `n` is set to the number needed.
        let r = unsafe { libc::getgrouplist(cname.as_ptr(), pw.pw_gid, groups.as_mut_ptr(), &mut n) };
        if r >= 0 {
            groups.truncate(n as usize);
            break;
        }
        if n as usize <= groups.len() || n > 65_536 {
            return Err(format!("cannot list the groups of run-as user '{name}'"));
        }
        groups.resize(n as usize, 0);
    }
    Ok(Account { name: name.to_string(), uid: pw.pw_uid, gid: pw.pw_gid, groups, home })
}

/// In the forked child, before exec: supplementary groups, then gid, then uid (the order in
/// which each step still has the privilege the next needs). Only raw syscalls.
pub fn drop_to(a: &Account) -> std::io::Result<()> {
    // SAFETY: raw syscalls on values resolved before the fork.
    unsafe {
        if libc::setgroups(a.groups.len(), a.groups.as_ptr()) != 0 || libc::setgid(a.gid) != 0 || libc::setuid(a.uid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // No way back: a child that could regain root would defeat the mapping.
        if libc::setuid(0) == 0 {
            return Err(std::io::Error::other("privileges could be regained after dropping them"));
        }
    }
    Ok(())
}
