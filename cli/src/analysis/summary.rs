//! The LayerNorm and RMSNorm report: FLOPs, traffic and saved bytes, fused
//! and composed.

use super::*;

/// Everything docs/layernorm.md reports for one normalization.
#[derive(Debug, Clone)]
pub struct NormReport {
    /// LayerNorm or RMSNorm.
    pub norm: Norm,
    /// Element type of the memory figures.
    pub dtype: &'static str,
    /// Rows.
    pub n: usize,
    /// Row length.
    pub d: usize,
    /// Fused forward / backward FLOPs.
    pub fused_flops: (FlopFit, FlopFit),
    /// Composed forward / backward FLOPs.
    pub composed_flops: (FlopFit, FlopFit),
    /// Fused traffic at `(n, d)`.
    pub fused_traffic: Traffic,
    /// Composed traffic at `(n, d)`.
    pub composed_traffic: Traffic,
    /// `Tape::saved_bytes` after the fused forward (leaf inputs).
    pub fused_saved: usize,
    /// `Tape::saved_bytes` after the composed forward.
    pub composed_saved: usize,
    /// The composed graph's saved bytes node by node.
    pub composed_saved_nodes: Vec<NodeMemory>,
}

/// [`NormReport`] for LayerNorm and RMSNorm.
#[derive(Debug, Clone)]
pub struct Report(pub Vec<NormReport>);

fn graph<T: Element>(case: &Case, fused: bool) -> Result<Tape<T>> {
    let tape = Tape::new();
    let vars: Vec<Var<T>> = case
        .inputs::<T>()?
        .into_iter()
        .map(|t| tape.var(t))
        .collect();
    let (x, p) = split_first(&vars)?;
    case.apply(fused, x, p)?;
    Ok(tape)
}

fn norm_report<T: Element>(norm: Norm, n: usize, d: usize) -> Result<NormReport> {
    let case = Case::new(norm, &[n, d], &[d]);
    let (elem, acc) = (std::mem::size_of::<T>(), std::mem::size_of::<T::Acc>());
    let fused = graph::<T>(&case, true)?;
    let composed = graph::<T>(&case, false)?;
    Ok(NormReport {
        norm,
        dtype: T::NAME,
        n,
        d,
        fused_flops: measure_flops(norm, true)?,
        composed_flops: measure_flops(norm, false)?,
        fused_traffic: node_traffic(&fused.nodes(), elem, acc),
        composed_traffic: node_traffic(&composed.nodes(), elem, acc),
        fused_saved: fused.saved_bytes(),
        composed_saved: composed.saved_bytes(),
        composed_saved_nodes: composed.saved_bytes_per_node(),
    })
}

/// The analysis for f32 tensors of `n` rows of `d` (FLOPs do not depend on
/// the shape beyond the fit; bytes and saved memory are for `(n, d)`).
pub fn report(n: usize, d: usize) -> Result<Report> {
    Ok(Report(vec![
        norm_report::<f32>(Norm::LayerNorm, n, d)?,
        norm_report::<f32>(Norm::RmsNorm, n, d)?,
    ]))
}

/// [`report`] at the shape docs/layernorm.md uses: 4096 rows of 1024.
pub fn default_report() -> Result<Report> {
    report(4096, 1024)
}

impl fmt::Display for FlopFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>5.1}/elem {:>6.1}/row {:>4.1}/col {:>4.0} fixed{}",
            self.per_elem,
            self.per_row,
            self.per_col,
            self.fixed,
            if self.exact { "" } else { " (fit not exact)" }
        )
    }
}

impl fmt::Display for NormReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nd = (self.n * self.d) as f64;
        let name = self.norm.name();
        writeln!(f, "== {name}: {} x {} ({}) ==", self.n, self.d, self.dtype)?;
        writeln!(
            f,
            "FLOPs (counted)      forward                                   backward"
        )?;
        writeln!(
            f,
            "  fused              {}   {}",
            self.fused_flops.0, self.fused_flops.1
        )?;
        writeln!(
            f,
            "  composed           {}   {}",
            self.composed_flops.0, self.composed_flops.1
        )?;
        writeln!(
            f,
            "Bytes moved per element (model)   forward   backward   total"
        )?;
        for (label, t) in [
            ("fused", &self.fused_traffic),
            ("composed", &self.composed_traffic),
        ] {
            writeln!(
                f,
                "  {label:<31} {:>8.2} {:>10.2} {:>7.2}",
                t.fwd as f64 / nd,
                t.bwd as f64 / nd,
                (t.fwd + t.bwd) as f64 / nd
            )?;
        }
        writeln!(
            f,
            "  ratio composed / fused          {:>8.2} {:>10.2} {:>7.2}",
            self.composed_traffic.fwd as f64 / self.fused_traffic.fwd.max(1) as f64,
            self.composed_traffic.bwd as f64 / self.fused_traffic.bwd.max(1) as f64,
            (self.composed_traffic.fwd + self.composed_traffic.bwd) as f64
                / (self.fused_traffic.fwd + self.fused_traffic.bwd).max(1) as f64
        )?;
        writeln!(
            f,
            "  composed graph, node by node (bytes per element of x):"
        )?;
        for t in &self.composed_traffic.nodes {
            writeln!(
                f,
                "    {:<12} {:<12} fwd {:>5.2} bwd {:>5.2}{}",
                t.op,
                format!("{:?}", t.shape),
                t.fwd as f64 / nd,
                t.bwd as f64 / nd,
                if t.modelled {
                    ""
                } else {
                    " (generic estimate)"
                }
            )?;
        }
        writeln!(f, "Saved for backward (Tape::saved_bytes, leaf inputs)")?;
        writeln!(
            f,
            "  fused     {:>12} B = {:.4} B/elem",
            self.fused_saved,
            self.fused_saved as f64 / nd
        )?;
        writeln!(
            f,
            "  composed  {:>12} B = {:.4} B/elem ({:.0}x fused)",
            self.composed_saved,
            self.composed_saved as f64 / nd,
            self.composed_saved as f64 / self.fused_saved.max(1) as f64
        )?;
        for m in self.composed_saved_nodes.iter().filter(|m| m.bytes > 0) {
            writeln!(f, "    {:<12} {:>12} B", m.op, m.bytes)?;
        }
        Ok(())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.0 {
            writeln!(f, "{r}")?;
        }
        Ok(())
    }
}
