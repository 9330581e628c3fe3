//! What a dynamically linked program needs at run time, read from its ELF file: the program
//! interpreter (`PT_INTERP`, the dynamic loader) and the shared libraries (`DT_NEEDED`,
//! found as the loader finds them: `DT_RUNPATH`/`DT_RPATH`, then the system directories).
//!
//! Nothing is executed (unlike `ldd`, which runs the program's loader): a binary from anywhere
//! can be inspected. Only 64-bit little-endian ELF files (x86_64, aarch64, riscv64, ppc64le)
//! are read; a static binary needs nothing.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} is not a 64-bit little-endian ELF file ({reason}): pass a Linux binary built for this machine"
    )]
    Unsupported { path: String, reason: &'static str },
    #[error("{path} is a malformed ELF file: {reason}")]
    Malformed { path: String, reason: &'static str },
    #[error(
        "library {name} (needed by {needed_by}) is in none of {searched:?}: install it on this \
         machine (the image copies it from here), or link the binary statically"
    )]
    LibraryNotFound {
        name: String,
        needed_by: String,
        searched: Vec<String>,
    },
}

/// The dynamic-linking facts of one ELF file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DynamicInfo {
    /// `PT_INTERP`: the loader's absolute path, for executables.
    pub interpreter: Option<String>,
    /// `DT_NEEDED` in file order.
    pub needed: Vec<String>,
    /// `DT_RUNPATH`, else `DT_RPATH`, split at `:`.
    pub runpath: Vec<String>,
}

/// A file the program needs: where it goes in the image, where it is read from here.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RuntimeFile {
    /// Absolute path inside the image (the path the loader opens).
    pub image_path: String,
    /// The file on this machine (symlinks are followed when it is read).
    pub host_path: PathBuf,
}

/// Parses `PT_INTERP` and the dynamic section of an ELF file's bytes.
pub fn dynamic_info(data: &[u8], path: &str) -> Result<DynamicInfo, ElfError> {
    let unsupported = |reason| ElfError::Unsupported {
        path: path.to_string(),
        reason,
    };
    let malformed = |reason| ElfError::Malformed {
        path: path.to_string(),
        reason,
    };
    if data.len() < 64 || &data[..4] != b"\x7fELF" {
        return Err(unsupported("no ELF magic"));
    }
    if data[4] != 2 {
        return Err(unsupported("not ELFCLASS64"));
    }
    if data[5] != 1 {
        return Err(unsupported("not little-endian"));
    }
    let u16_at = |at: usize| -> Option<u16> {
        Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
    };
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
    };
    let phoff = u64_at(0x20).ok_or_else(|| malformed("short header"))? as usize;
    let phentsize = u16_at(0x36).ok_or_else(|| malformed("short header"))? as usize;
    let phnum = u16_at(0x38).ok_or_else(|| malformed("short header"))? as usize;
    if phentsize < 56 {
        return Err(malformed("program header entries too small"));
    }

    struct Segment {
        kind: u32,
        offset: u64,
        vaddr: u64,
        filesz: u64,
    }
    let mut segments = Vec::with_capacity(phnum);
    for i in 0..phnum {
        let at = phoff
            .checked_add(i * phentsize)
            .ok_or_else(|| malformed("program header offset overflows"))?;
        let segment = (|| {
            Some(Segment {
                kind: u32_at(at)?,
                offset: u64_at(at + 8)?,
                vaddr: u64_at(at + 16)?,
                filesz: u64_at(at + 32)?,
            })
        })()
        .ok_or_else(|| malformed("program headers past the end of the file"))?;
        segments.push(segment);
    }
    let bytes_of = |offset: u64, size: u64| -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(size).ok()?)?;
        data.get(start..end)
    };

    let mut info = DynamicInfo::default();
    if let Some(interp) = segments.iter().find(|s| s.kind == PT_INTERP) {
        let raw = bytes_of(interp.offset, interp.filesz)
            .ok_or_else(|| malformed("PT_INTERP past the end of the file"))?;
        let raw = raw.split(|b| *b == 0).next().unwrap_or_default();
        let interp = std::str::from_utf8(raw).map_err(|_| malformed("PT_INTERP is not UTF-8"))?;
        info.interpreter = Some(interp.to_string());
    }
    let Some(dynamic) = segments.iter().find(|s| s.kind == PT_DYNAMIC) else {
        return Ok(info); // static
    };
    let dynamic = bytes_of(dynamic.offset, dynamic.filesz)
        .ok_or_else(|| malformed("PT_DYNAMIC past the end of the file"))?;
    let mut entries = Vec::new();
    for entry in dynamic.chunks_exact(16) {
        let tag = u64::from_le_bytes(entry[..8].try_into().unwrap_or_default());
        let value = u64::from_le_bytes(entry[8..].try_into().unwrap_or_default());
        if tag == DT_NULL {
            break;
        }
        entries.push((tag, value));
    }
    let find = |tag| entries.iter().find(|(t, _)| *t == tag).map(|(_, v)| *v);
    let strtab_vaddr = find(DT_STRTAB).ok_or_else(|| malformed("no DT_STRTAB"))?;
    let strsz = find(DT_STRSZ).ok_or_else(|| malformed("no DT_STRSZ"))?;
    // DT_STRTAB is an address: map it to a file offset through the PT_LOAD segment holding it.
    let strtab_offset = segments
        .iter()
        .filter(|s| s.kind == PT_LOAD)
        .find(|s| strtab_vaddr >= s.vaddr && strtab_vaddr < s.vaddr.saturating_add(s.filesz))
        .map(|s| strtab_vaddr - s.vaddr + s.offset)
        .ok_or_else(|| malformed("DT_STRTAB is in no loaded segment"))?;
    let strtab =
        bytes_of(strtab_offset, strsz).ok_or_else(|| malformed("string table past the end"))?;
    let string = |offset: u64| -> Result<String, ElfError> {
        let rest = usize::try_from(offset)
            .ok()
            .and_then(|o| strtab.get(o..))
            .ok_or_else(|| malformed("string offset outside the string table"))?;
        let raw = rest.split(|b| *b == 0).next().unwrap_or_default();
        std::str::from_utf8(raw)
            .map(str::to_string)
            .map_err(|_| malformed("a dynamic string is not UTF-8"))
    };
    for (tag, value) in &entries {
        if *tag == DT_NEEDED {
            info.needed.push(string(*value)?);
        }
    }
    let runpath = match (find(DT_RUNPATH), find(DT_RPATH)) {
        (Some(v), _) | (None, Some(v)) => string(v)?,
        (None, None) => String::new(),
    };
    info.runpath = runpath
        .split(':')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    Ok(info)
}

/// [`dynamic_info`] of the file at `path`.
pub fn read_dynamic_info(path: &Path) -> Result<DynamicInfo, ElfError> {
    let data = std::fs::read(path).map_err(|source| ElfError::Io {
        path: path.display().to_string(),
        source,
    })?;
    dynamic_info(&data, &path.display().to_string())
}

/// The directories glibc's loader searches after a library's runpath (its built-in trusted
/// directories on Debian and most distributions; `ld.so.cache` is not consulted).
pub fn system_library_dirs() -> Vec<String> {
    let multiarch = match std::env::consts::ARCH {
        "x86_64" => Some("x86_64-linux-gnu"),
        "aarch64" => Some("aarch64-linux-gnu"),
        "riscv64" => Some("riscv64-linux-gnu"),
        "powerpc64" => Some("powerpc64le-linux-gnu"),
        "s390x" => Some("s390x-linux-gnu"),
        _ => None,
    };
    let mut dirs = Vec::new();
    if let Some(m) = multiarch {
        dirs.push(format!("/lib/{m}"));
        dirs.push(format!("/usr/lib/{m}"));
    }
    dirs.extend(["/lib64", "/usr/lib64", "/lib", "/usr/lib"].map(String::from));
    dirs
}

/// Everything `binary` needs to start besides itself: the loader at its `PT_INTERP` path and
/// every library it loads, directly or through other libraries, at the path the loader finds
/// it under (`system_dirs`, usually [`system_library_dirs`]). Sorted by image path.
pub fn runtime_files(binary: &Path, system_dirs: &[String]) -> Result<Vec<RuntimeFile>, ElfError> {
    let info = read_dynamic_info(binary)?;
    let mut found: BTreeMap<String, RuntimeFile> = BTreeMap::new();
    let interpreter_name = info
        .interpreter
        .as_deref()
        .and_then(|i| Path::new(i).file_name())
        .map(|n| n.to_string_lossy().into_owned());
    if let Some(interp) = &info.interpreter {
        found.insert(
            interp.clone(),
            RuntimeFile {
                image_path: interp.clone(),
                host_path: PathBuf::from(interp),
            },
        );
    }
    // Libraries by soname: the loader loads each once, wherever it was found first.
    let mut loaded: BTreeMap<String, ()> = BTreeMap::new();
    let mut queue: VecDeque<(String, PathBuf, Vec<String>)> = info
        .needed
        .iter()
        .map(|n| (n.clone(), binary.to_path_buf(), info.runpath.clone()))
        .collect();
    while let Some((name, needed_by, runpath)) = queue.pop_front() {
        // libc names the loader itself: it is loaded already.
        if Some(&name) == interpreter_name.as_ref() || loaded.contains_key(&name) {
            continue;
        }
        loaded.insert(name.clone(), ());
        let origin = needed_by
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let dirs: Vec<String> = runpath
            .iter()
            .map(|d| d.replace("$ORIGIN", &origin).replace("${ORIGIN}", &origin))
            .chain(system_dirs.iter().cloned())
            .collect();
        let candidates: Vec<String> = if name.contains('/') {
            vec![name.clone()]
        } else {
            dirs.iter().map(|d| format!("{d}/{name}")).collect()
        };
        // As the loader does, a file of another ELF class (a 32-bit library) is passed over.
        let mut hit = None;
        for candidate in candidates {
            if !Path::new(&candidate).is_file() {
                continue;
            }
            match read_dynamic_info(Path::new(&candidate)) {
                Ok(info) => {
                    hit = Some((candidate, info));
                    break;
                }
                Err(ElfError::Unsupported { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        let Some((path, lib)) = hit else {
            return Err(ElfError::LibraryNotFound {
                name,
                needed_by: needed_by.display().to_string(),
                searched: dirs,
            });
        };
        for next in &lib.needed {
            queue.push_back((next.clone(), PathBuf::from(&path), lib.runpath.clone()));
        }
        found.insert(
            path.clone(),
            RuntimeFile {
                image_path: path.clone(),
                host_path: PathBuf::from(path),
            },
        );
    }
    Ok(found.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 executable image: header, PT_INTERP, PT_LOAD over the whole file,
    /// PT_DYNAMIC with DT_NEEDED entries, DT_RUNPATH and the string table.
    fn fake_elf(interp: Option<&str>, needed: &[&str], runpath: Option<&str>) -> Vec<u8> {
        const VADDR: u64 = 0x400000;
        let mut strtab = vec![0u8];
        let mut add = |s: &str| {
            let at = strtab.len() as u64;
            strtab.extend_from_slice(s.as_bytes());
            strtab.push(0);
            at
        };
        let needed: Vec<u64> = needed.iter().map(|n| add(n)).collect();
        let runpath = runpath.map(&mut add);
        let interp_bytes = interp.map(|i| {
            let mut b = i.as_bytes().to_vec();
            b.push(0);
            b
        });
        let phnum = 2 + u64::from(interp.is_some());
        let phoff = 64u64;
        let interp_off = phoff + phnum * 56;
        let strtab_off = interp_off + interp_bytes.as_ref().map_or(0, |b| b.len() as u64);
        let dyn_off = strtab_off + strtab.len() as u64;
        let mut dynamic: Vec<(u64, u64)> = needed.iter().map(|n| (DT_NEEDED, *n)).collect();
        if let Some(r) = runpath {
            dynamic.push((DT_RUNPATH, r));
        }
        dynamic.push((DT_STRTAB, VADDR + strtab_off));
        dynamic.push((DT_STRSZ, strtab.len() as u64));
        dynamic.push((DT_NULL, 0));
        let dyn_size = dynamic.len() as u64 * 16;
        let total = dyn_off + dyn_size;

        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2;
        out[5] = 1;
        out[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        out[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        out[0x38..0x3a].copy_from_slice(&(phnum as u16).to_le_bytes());
        let mut ph = |kind: u32, offset: u64, size: u64| {
            let mut h = vec![0u8; 56];
            h[..4].copy_from_slice(&kind.to_le_bytes());
            h[8..16].copy_from_slice(&offset.to_le_bytes());
            h[16..24].copy_from_slice(&(VADDR + offset).to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            out.extend(h);
        };
        if let Some(b) = &interp_bytes {
            ph(PT_INTERP, interp_off, b.len() as u64);
        }
        ph(PT_LOAD, 0, total);
        ph(PT_DYNAMIC, dyn_off, dyn_size);
        if let Some(b) = &interp_bytes {
            out.extend(b);
        }
        out.extend(&strtab);
        for (t, v) in dynamic {
            out.extend(t.to_le_bytes());
            out.extend(v.to_le_bytes());
        }
        out
    }

    #[test]
    fn interpreter_needed_and_runpath_are_read() {
        let elf = fake_elf(
            Some("/lib64/ld-linux-x86-64.so.2"),
            &["libgcc_s.so.1", "libc.so.6"],
            Some("$ORIGIN/../lib:/opt/x"),
        );
        let info = dynamic_info(&elf, "fake").unwrap();
        assert_eq!(
            info.interpreter.as_deref(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
        assert_eq!(info.needed, ["libgcc_s.so.1", "libc.so.6"]);
        assert_eq!(info.runpath, ["$ORIGIN/../lib", "/opt/x"]);
    }

    #[test]
    fn a_static_binary_needs_nothing() {
        let mut elf = fake_elf(None, &[], None);
        // Turn PT_DYNAMIC into PT_NULL: no dynamic section at all.
        let dynamic_ph = 64 + 56;
        elf[dynamic_ph..dynamic_ph + 4].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            dynamic_info(&elf, "static").unwrap(),
            DynamicInfo::default()
        );
    }

    #[test]
    fn non_elf_and_truncated_files_are_refused() {
        let e = dynamic_info(b"#!/bin/sh\necho hi\n", "script").unwrap_err();
        assert!(e.to_string().contains("no ELF magic"), "{e}");
        let elf = fake_elf(Some("/lib/ld.so"), &["libc.so.6"], None);
        let e = dynamic_info(&elf[..150], "short").unwrap_err();
        assert!(matches!(e, ElfError::Malformed { .. }), "{e}");
    }

    #[test]
    fn libraries_are_found_through_runpath_origin_then_system_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("app/lib")).unwrap();
        std::fs::create_dir_all(d.join("sys")).unwrap();
        std::fs::write(
            d.join("app/prog"),
            fake_elf(
                Some("/lib/ld.so"),
                &["libown.so", "libc.so.6"],
                Some("$ORIGIN/lib"),
            ),
        )
        .unwrap();
        // libown needs libdep (system) and the loader by name (skipped).
        std::fs::write(
            d.join("app/lib/libown.so"),
            fake_elf(None, &["libdep.so", "ld.so"], None),
        )
        .unwrap();
        std::fs::write(
            d.join("sys/libdep.so"),
            fake_elf(None, &["libc.so.6"], None),
        )
        .unwrap();
        std::fs::write(d.join("sys/libc.so.6"), fake_elf(None, &["ld.so"], None)).unwrap();
        // A 32-bit libc earlier in the search order is passed over.
        std::fs::create_dir_all(d.join("sys32")).unwrap();
        let mut elf32 = fake_elf(None, &[], None);
        elf32[4] = 1;
        std::fs::write(d.join("sys32/libc.so.6"), elf32).unwrap();
        let sys = vec![
            d.join("sys32").display().to_string(),
            d.join("sys").display().to_string(),
        ];
        let files = runtime_files(&d.join("app/prog"), &sys).unwrap();
        let paths: Vec<String> = files.iter().map(|f| f.image_path.clone()).collect();
        let mut expected = vec![
            "/lib/ld.so".to_string(),
            format!("{}/app/lib/libown.so", d.display()),
            format!("{}/sys/libc.so.6", d.display()),
            format!("{}/sys/libdep.so", d.display()),
        ];
        expected.sort();
        assert_eq!(paths, expected);

        std::fs::remove_file(d.join("sys/libdep.so")).unwrap();
        let e = runtime_files(&d.join("app/prog"), &sys).unwrap_err();
        assert!(
            e.to_string().contains("library libdep.so (needed by"),
            "{e}"
        );
    }

    /// coreutils' `ls` loads libraries that load others (libselinux → libpcre2): what is
    /// found matches `ldd`, and so does this test executable's short list.
    #[test]
    fn programs_here_need_what_ldd_lists() {
        for exe in [PathBuf::from("/bin/ls"), std::env::current_exe().unwrap()] {
            same_as_ldd(&exe);
        }
    }

    fn same_as_ldd(exe: &Path) {
        let files = runtime_files(exe, &system_library_dirs()).unwrap();
        let ldd = match std::process::Command::new("ldd").arg(exe).output() {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
            _ => return, // no ldd here: the parser's own tests above stand
        };
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" and "/lib64/ld-linux….so.2 (0x…)"
        let mut from_ldd: Vec<String> = ldd
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let path = match l.split_once(" => ") {
                    Some((_, rest)) => rest.split(" (").next()?,
                    None => l.split(" (").next()?,
                };
                path.starts_with('/').then(|| path.to_string())
            })
            .collect();
        from_ldd.sort();
        let mut ours: Vec<String> = files.iter().map(|f| f.image_path.clone()).collect();
        ours.sort();
        assert_eq!(ours, from_ldd, "ldd said:\n{ldd}");
    }
}
