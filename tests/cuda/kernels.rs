//! Every CUDA kernel compiles with NVRTC for sm_80 and sm_90 with no
//! spills. Needs no GPU, only NVRTC (`scripts/install-cuda-tools.sh`, which
//! `.ci/run` calls); without it the test says why it skipped.

#[cfg(feature = "cuda")]
#[test]
fn every_kernel_compiles_without_spills() {
    use fusegrad::device::CHECKED_ARCHS;
    use fusegrad::kernel_table;
    use fusegrad::Error;
    let rows = match kernel_table(&CHECKED_ARCHS, None) {
        Err(Error::CudaUnavailable { reason }) => {
            eprintln!("skipped: {reason}");
            return;
        }
        Err(e) => panic!("kernel compile failed:\n{e}"),
        Ok(r) => r,
    };
    // Every family exports kernels, for both architectures.
    assert!(rows.len() >= 20, "only {} kernels", rows.len());
    for arch in CHECKED_ARCHS {
        assert!(rows.iter().any(|r| r.arch == arch), "nothing for sm_{arch}");
    }
    let spilled: Vec<String> = rows
        .iter()
        .filter(|r| r.spill_bytes > 0)
        .map(|r| format!("{} sm_{}: {} bytes", r.kernel, r.arch, r.spill_bytes))
        .collect();
    assert!(spilled.is_empty(), "spills:\n{}", spilled.join("\n"));
    assert!(rows.iter().all(|r| r.registers > 0 && r.registers <= 255));
}
