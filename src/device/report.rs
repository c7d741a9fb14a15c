//! What fusegrad finds of CUDA on this machine, one line per part, in the
//! order a first GPU run needs them: the GPU, the driver, NVRTC, cuBLAS,
//! the kernel cache (and whether its entries match this NVRTC), and with
//! `load` every family loaded on the GPU. `fusegrad devices` prints it;
//! the report's Devices section is its first lines.

use super::nvrtc::Family;
use super::{cuda, driver_lib, kernel_cache, nvrtc};

/// The lines of [`crate::cuda_report`].
#[derive(Clone, Debug, PartialEq)]
pub struct CudaReport {
    /// `part: finding` lines.
    pub lines: Vec<String>,
    /// Whether cuda:0 can be used (with `load`: and every family loaded).
    pub usable: bool,
}

impl std::fmt::Display for CudaReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for l in &self.lines {
            writeln!(f, "{l}")?;
        }
        Ok(())
    }
}

fn version((a, b): (i32, i32)) -> String {
    format!("{a}.{b}")
}

/// How the cache's entries for `families` on `sm_<arch>` stand against
/// the NVRTC here (`None`: none found).
fn cache_line(families: &[&Family], arch: u32, here: Option<(i32, i32)>) -> String {
    let Some(dir) = kernel_cache::kernel_stats().dir else {
        return "kernel cache: off (no folder can be written): every family compiles in memory"
            .into();
    };
    let mut by: std::collections::BTreeMap<(i32, i32), usize> = Default::default();
    let mut missing = Vec::new();
    for f in families {
        match kernel_cache::entry_nvrtc(f.name, f.source, arch, Some(&dir)) {
            Some(v) => *by.entry(v).or_default() += 1,
            None => missing.push(f.name),
        }
    }
    let made: Vec<String> = by
        .iter()
        .map(|(v, n)| format!("{n} by NVRTC {}", version(*v)))
        .collect();
    let mut s = format!(
        "kernel cache: {}: {} of {} families for sm_{arch}",
        dir.display(),
        families.len() - missing.len(),
        families.len()
    );
    if !made.is_empty() {
        s += &format!(" ({})", made.join(", "));
    }
    if !missing.is_empty() {
        s += &format!("; missing: {}", missing.join(", "));
    }
    let kit: Vec<(i32, i32)> = by.keys().copied().collect();
    s += &match (here, kit.as_slice()) {
        (_, []) => String::new(),
        (Some(h), [k]) if *k == h => "; they match this NVRTC".into(),
        (Some(h), _) => format!(
            "; this NVRTC is {}: the entries run as they are, a missing family compiles with it",
            version(h)
        ),
        (None, _) => {
            "; no NVRTC here: the entries run without it, a missing family cannot compile".into()
        }
    };
    s
}

/// The report for `families`; with `load`, each is loaded on cuda:0.
pub(crate) fn cuda_report(families: &[&'static Family], load: bool) -> CudaReport {
    let gpu = cuda::gpu(0);
    let mut lines = vec![match super::Device::cuda_status() {
        Ok(s) => format!("GPU: {s}"),
        Err(e) => format!("GPU: none usable ({e})"),
    }];
    lines.push(match driver_lib::driver_version() {
        Ok(v) => format!("driver: {v}"),
        Err(e) => format!("driver: none ({e})"),
    });
    let here = nvrtc::nvrtc_info();
    lines.push(match &here {
        Ok(n) => format!("kernel compiler: {n}"),
        Err(e) => format!("kernel compiler: none ({e})"),
    });
    lines.push(match driver_lib::cublas_version() {
        Ok(v) => format!("cuBLAS: {v}"),
        Err(e) => format!("cuBLAS: none ({e})"),
    });
    let arch = gpu.as_ref().map_or(90, |g| g.arch);
    lines.push(cache_line(
        families,
        arch,
        here.as_ref().ok().map(|n| n.version),
    ));
    let mut usable = gpu.is_ok();
    if let (true, Ok(g)) = (load, &gpu) {
        let failed: Vec<String> = families
            .iter()
            .filter_map(|f| g.load_family(f).err().map(|e| e.to_string()))
            .collect();
        let ptx = g.ptx_families();
        lines.push(if let Some(first) = failed.first() {
            usable = false;
            format!(
                "kernels: {} of {} families failed to load on cuda:0; the first: {first}",
                failed.len(),
                families.len()
            )
        } else if let Some((_, why)) = ptx.first() {
            let names: Vec<&str> = ptx.iter().map(|(n, _)| *n).collect();
            format!(
                "kernels: {} families loaded on cuda:0, {} from PTX ({}; the driver refused {why})",
                g.families_loaded(),
                ptx.len(),
                names.join(", ")
            )
        } else {
            format!(
                "kernels: {} families loaded on cuda:0, all from CUBIN",
                g.families_loaded()
            )
        });
    }
    CudaReport { lines, usable }
}
