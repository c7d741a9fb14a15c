//! Bytes moved, from a traffic model applied node by node to a recorded
//! graph.

use super::*;

/// Bytes one node reads and writes, forward and backward.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTraffic {
    /// Op name.
    pub op: &'static str,
    /// Output shape.
    pub shape: Vec<usize>,
    /// Forward bytes (read + written).
    pub fwd: usize,
    /// Backward bytes (read + written), including summing broadcast
    /// gradients back and accumulating fan-out.
    pub bwd: usize,
    /// False when the op is not in the model and a generic estimate was used.
    pub modelled: bool,
}

/// Bytes moved by a recorded graph, forward and backward.
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    /// Per node (ops only, oldest first).
    pub nodes: Vec<NodeTraffic>,
    /// Forward total.
    pub fwd: usize,
    /// Backward total.
    pub bwd: usize,
}

/// The traffic model, applied to the nodes of a graph whose elements take
/// `elem` bytes and whose statistics take `acc` bytes.
///
/// Each op streams its operands from memory once and writes its result once
/// (what the kernels in `ops/` do; re-reads of a row that is still in cache,
/// of a small broadcast operand and of an operand passed twice count once). With `O` the output's
/// element count, `I` an input's and `s = elem`:
///
/// | op | forward | backward, per input that needs a gradient |
/// |---|---|---|
/// | `add`, `sub` | `s(I_a + I_b + O)` | none (`g` is passed on; `sub` negates its second: `2sO`) |
/// | `mul` | `s(I_a + I_b + O)` | read `g` and the other operand, write: `s(O + I_other + O)` |
/// | `mean_axes`, `sum_axes` | `s(I + O)` | read `g`, write the broadcast: `s(O + I)` |
/// | `rsqrt`, `sqrt`, `exp` | `s(I + O)` | read `g` and the saved output, write: `3sO` |
/// | `scalar_add` | `s(I + O)` | none (`g` is passed on) |
/// | `reshape` | none (shared storage) | none |
/// | `layer_norm` (fused) | read x, gamma, beta; write y, 2N stats | read x, dy, gamma, stats; write dx; write and read one `2D` partial per group; write dgamma, dbeta |
/// | `rms_norm` (fused) | read x, gamma; write y, N stats | as `layer_norm` with one statistic and a `D` partial |
///
/// On top of the table: a gradient of the broadcast output shape for a
/// smaller input is summed back (`s(O + I)`), and a node that receives `k`
/// gradients accumulates `k - 1` times (read two, write one: `3sI` each).
/// Ops outside the table get a generic estimate (forward: read inputs,
/// write output; backward: read `g` and every input, write every needed
/// gradient) and are flagged `modelled = false`.
pub fn node_traffic(nodes: &[NodeInfo], elem: usize, acc: usize) -> Traffic {
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let mut contrib = vec![0usize; nodes.len()];
    let mut out = Vec::new();
    for node in nodes.iter().filter(|n| n.op != "leaf") {
        let o = numel(&node.shape);
        let ins: Vec<&NodeInfo> = node.inputs.iter().filter_map(|&i| nodes.get(i)).collect();
        let isz: Vec<usize> = ins.iter().map(|n| numel(&n.shape)).collect();
        let need: Vec<bool> = ins.iter().map(|n| n.requires_grad).collect();
        // Forward reads: each distinct input once (mul(x, x) streams x once).
        let sum_in: usize = isz
            .iter()
            .enumerate()
            .filter(|(k, _)| !node.inputs[..*k].contains(&node.inputs[*k]))
            .map(|(_, v)| v)
            .sum();
        let back = |i: usize| {
            if ins[i].shape != node.shape {
                o + isz[i]
            } else {
                0
            }
        };
        let mut modelled = true;
        let (fwd, bwd) = match node.op {
            "add" | "sub" => {
                let mut b = 0;
                for (i, _) in need.iter().enumerate().filter(|(_, n)| **n) {
                    b += back(i) + if node.op == "sub" && i == 1 { 2 * o } else { 0 };
                }
                ((sum_in + o) * elem, b * elem)
            }
            "mul" => {
                let mut b = 0;
                for (i, _) in need.iter().enumerate().filter(|(_, n)| **n) {
                    let other = isz.get(1 - i.min(1)).copied().unwrap_or(0);
                    b += 2 * o + other + back(i);
                }
                ((sum_in + o) * elem, b * elem)
            }
            "mean_axes" | "sum_axes" | "mean" | "sum" => (
                (sum_in + o) * elem,
                if need[0] { (o + sum_in) * elem } else { 0 },
            ),
            "rsqrt" | "sqrt" | "exp" => {
                ((sum_in + o) * elem, if need[0] { 3 * o * elem } else { 0 })
            }
            "scalar_add" => ((sum_in + o) * elem, 0),
            "reshape" => (0, 0),
            "layer_norm" | "rms_norm" => {
                let stats = if node.op == "layer_norm" { 2 } else { 1 };
                fused_traffic_node(node, &isz, &need, elem, acc, stats)
            }
            _ => {
                modelled = false;
                let b: usize = isz
                    .iter()
                    .zip(&need)
                    .map(|(i, n)| if *n { *i } else { 0 })
                    .sum();
                ((sum_in + o) * elem, (o + sum_in + b) * elem)
            }
        };
        for (k, &j) in node.inputs.iter().enumerate() {
            if need.get(k).copied().unwrap_or(false) {
                if let Some(c) = contrib.get_mut(j) {
                    *c += 1;
                }
            }
        }
        out.push(NodeTraffic {
            op: node.op,
            shape: node.shape.clone(),
            fwd,
            bwd,
            modelled,
        });
    }
    // Fan-out: every gradient after the first is accumulated.
    let accumulate: usize = nodes
        .iter()
        .zip(&contrib)
        .map(|(n, &c)| c.saturating_sub(1) * 3 * numel(&n.shape) * elem)
        .sum();
    let fwd = out.iter().map(|t| t.fwd).sum();
    let bwd = out.iter().map(|t| t.bwd).sum::<usize>() + accumulate;
    Traffic {
        nodes: out,
        fwd,
        bwd,
    }
}

/// The fused ops' row of the traffic table.
fn fused_traffic_node(
    node: &NodeInfo,
    isz: &[usize],
    need: &[bool],
    elem: usize,
    acc: usize,
    stats: usize,
) -> (usize, usize) {
    let nd = isz.first().copied().unwrap_or(0);
    // Row length: a parameter's size, else the last dim (the node does not
    // record its normalized shape; without parameters this assumes the
    // last-axis form).
    let d = isz
        .get(1)
        .copied()
        .or_else(|| node.shape.last().copied())
        .unwrap_or(1)
        .max(1);
    let n = nd / d;
    let params: usize = isz.iter().skip(1).sum();
    let fwd = (nd + params + nd) * elem + stats * n * acc;
    let groups = fusegrad::probes::norm_groups(n, d);
    let want_params = need.iter().skip(1).any(|&b| b);
    // Each group writes its partial rows and the reduction reads them back.
    let partial = if want_params {
        2 * groups * (isz.len() - 1) * d * acc
    } else {
        0
    };
    let gamma = isz.get(1).copied().unwrap_or(0);
    let bwd = (2 * nd + gamma + nd) * elem
        + stats * n * acc
        + partial
        + need
            .iter()
            .zip(isz)
            .skip(1)
            .map(|(b, i)| if *b { *i } else { 0 })
            .sum::<usize>()
            * elem;
    (fwd, bwd)
}
