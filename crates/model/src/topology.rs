//! GPU topology inside a node, and the one scoring function that both the
//! scheduler (GPU-set choice) and the node agent (`GetPreferredAllocation`)
//! use, so both agree on which GPUs are best.
//!
//! The link between two GPUs is ranked, best first:
//! 1. same NVLink domain (NVSwitch node, bridged pair, NVL72 domain),
//!    refined by NUMA locality;
//! 2. same PCIe switch;
//! 3. same NUMA node (traffic crosses the host bridge);
//! 4. different NUMA nodes (traffic crosses the CPU interconnect).
//!
//! A set's cost is the sum of its pairwise link costs. [`choose`] picks a set
//! of the requested size with a greedy expansion from every possible seed
//! (O(n²·k) for n candidates and k GPUs, no exhaustive search) and breaks ties
//! by best fit (prefer GPUs whose topology group has fewer free GPUs, so large
//! groups stay whole for large requests), then by lowest indices.

use serde::{Deserialize, Serialize};

/// Where a GPU sits in its node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuTopo {
    /// NVLink domain inside the node (all GPUs of an NVSwitch node share one;
    /// a bridged pair has one of its own). `None`: no NVLink.
    pub nvlink: Option<u32>,
    /// PCIe switch the GPU hangs off. `None`: unknown.
    pub pcie_switch: Option<u32>,
    /// NUMA node. `None`: unknown.
    pub numa: Option<u32>,
}

/// Link cost between two GPUs (lower is better).
pub fn link_cost(a: &GpuTopo, b: &GpuTopo) -> u32 {
    let same = |x: Option<u32>, y: Option<u32>| matches!((x, y), (Some(p), Some(q)) if p == q);
    if same(a.nvlink, b.nvlink) {
        if same(a.numa, b.numa) { 10 } else { 11 }
    } else if same(a.pcie_switch, b.pcie_switch) {
        20
    } else if same(a.numa, b.numa) || (a.numa.is_none() && b.numa.is_none()) {
        30
    } else {
        40
    }
}

/// Sum of pairwise link costs of a set (indices into `topos`).
pub fn set_cost(topos: &[GpuTopo], set: &[usize]) -> u64 {
    let mut c = 0u64;
    for (i, &a) in set.iter().enumerate() {
        for &b in &set[i + 1..] {
            c += link_cost(&topos[a], &topos[b]) as u64;
        }
    }
    c
}

/// The best-known set cost for `k` GPUs, used to normalise a score.
pub fn ideal_cost(k: usize) -> u64 {
    (k * k.saturating_sub(1) / 2) as u64 * 10
}

/// Picks `count` GPUs from `available` (indices into `topos`), always
/// including `must_include`. Returns the chosen indices in ascending order,
/// or `None` if there are not enough candidates or `must_include` is not a
/// subset of `available`. Deterministic for a given input.
pub fn choose(
    topos: &[GpuTopo],
    available: &[usize],
    must_include: &[usize],
    count: usize,
) -> Option<Vec<usize>> {
    let mut avail: Vec<usize> = available
        .iter()
        .copied()
        .filter(|&i| i < topos.len())
        .collect();
    avail.sort_unstable();
    avail.dedup();
    let mut must: Vec<usize> = must_include.to_vec();
    must.sort_unstable();
    must.dedup();
    if must.iter().any(|m| avail.binary_search(m).is_err()) || must.len() > count {
        return None;
    }
    if avail.len() < count {
        return None;
    }
    if count == 0 {
        return Some(Vec::new());
    }
    if avail.len() == count {
        return Some(avail);
    }
    let n = avail.len();
    // Pairwise link costs among the candidates, computed once.
    let mut cost = vec![0u8; n * n];
    for i in 0..n {
        for j in 0..n {
            cost[i * n + j] = if i == j {
                0
            } else {
                link_cost(&topos[avail[i]], &topos[avail[j]]) as u8
            };
        }
    }
    // Best-fit weight: how many free GPUs share this GPU's tightest group.
    let group_free: Vec<u64> = (0..n)
        .map(|i| {
            let nv = (0..n).filter(|&j| i == j || cost[i * n + j] <= 11).count() as u64;
            let sw = (0..n)
                .filter(|&j| {
                    topos[avail[i]].pcie_switch.is_some()
                        && topos[avail[i]].pcie_switch == topos[avail[j]].pcie_switch
                })
                .count() as u64;
            nv * 1000 + sw
        })
        .collect();
    let pos = |g: usize| avail.binary_search(&g).ok();

    // Seeds: every candidate, but only one per (topology, best-fit weight)
    // class — equivalent seeds grow equivalent sets.
    let seeds: Vec<Vec<usize>> = if must.is_empty() {
        let mut seen: Vec<(GpuTopo, u64)> = Vec::new();
        (0..n)
            .filter(|&i| {
                let key = (topos[avail[i]], group_free[i]);
                if seen.contains(&key) {
                    false
                } else {
                    seen.push(key);
                    true
                }
            })
            .map(|i| vec![i])
            .collect()
    } else {
        vec![must.iter().filter_map(|&m| pos(m)).collect()]
    };
    let mut best: Option<(u64, u64, Vec<usize>)> = None;
    let mut add_cost = vec![0u64; n];
    let mut taken = vec![false; n];
    for seed in seeds {
        taken.iter_mut().for_each(|t| *t = false);
        add_cost.iter_mut().for_each(|c| *c = 0);
        let mut set: Vec<usize> = Vec::with_capacity(count);
        let mut total = 0u64;
        for &p in &seed {
            taken[p] = true;
            total += add_cost[p];
            set.push(p);
            for q in 0..n {
                add_cost[q] += cost[p * n + q] as u64;
            }
        }
        while set.len() < count {
            let mut pick: Option<usize> = None;
            for q in 0..n {
                if taken[q] {
                    continue;
                }
                pick = match pick {
                    None => Some(q),
                    Some(p) if (add_cost[q], group_free[q]) < (add_cost[p], group_free[p]) => {
                        Some(q)
                    }
                    keep => keep,
                };
            }
            let q = pick?;
            taken[q] = true;
            total += add_cost[q];
            set.push(q);
            for r in 0..n {
                add_cost[r] += cost[q * n + r] as u64;
            }
        }
        let fit: u64 = set.iter().map(|&p| group_free[p]).sum();
        let mut gpus: Vec<usize> = set.iter().map(|&p| avail[p]).collect();
        gpus.sort_unstable();
        let better = match &best {
            None => true,
            Some((c, f, s)) => (total, fit, &gpus) < (*c, *f, s),
        };
        if better {
            best = Some((total, fit, gpus));
        }
    }
    best.map(|(_, _, s)| s)
}

/// The lowest set cost of `k` GPUs among `available`, by trying every
/// subset: the reference that [`choose`] is checked against in tests. It is
/// exponential, so it answers `None` for more than 24 candidates.
pub fn exhaustive_min_cost(topos: &[GpuTopo], available: &[usize], k: usize) -> Option<u64> {
    let n = available.len();
    if n > 24 || k > n {
        return None;
    }
    let mut best = u64::MAX;
    for mask in 0u32..(1 << n) {
        if mask.count_ones() as usize != k {
            continue;
        }
        let set: Vec<usize> = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| available[i])
            .collect();
        best = best.min(set_cost(topos, &set));
    }
    Some(best)
}

/// Topology of common node shapes, for fixtures, tests and generators.
pub mod shapes {
    use super::GpuTopo;

    /// NVSwitch node (e.g. DGX H100): one NVLink domain, `switches` PCIe
    /// switches and `numa` NUMA nodes, GPUs spread evenly in index order.
    pub fn nvswitch(n: usize, switches: usize, numa: usize) -> Vec<GpuTopo> {
        (0..n)
            .map(|i| GpuTopo {
                nvlink: Some(0),
                pcie_switch: Some((i * switches.max(1) / n) as u32),
                numa: Some((i * numa.max(1) / n) as u32),
            })
            .collect()
    }

    /// PCIe node without NVLink.
    pub fn pcie(n: usize, switches: usize, numa: usize) -> Vec<GpuTopo> {
        nvswitch(n, switches, numa)
            .into_iter()
            .map(|t| GpuTopo { nvlink: None, ..t })
            .collect()
    }

    /// PCIe node whose GPUs are NVLink-bridged in pairs (0-1, 2-3, …).
    pub fn bridged_pairs(n: usize, switches: usize, numa: usize) -> Vec<GpuTopo> {
        nvswitch(n, switches, numa)
            .into_iter()
            .enumerate()
            .map(|(i, t)| GpuTopo {
                nvlink: Some((i / 2) as u32),
                ..t
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute_min(topos: &[GpuTopo], avail: &[usize], k: usize) -> u64 {
        exhaustive_min_cost(topos, avail, k).unwrap()
    }

    #[test]
    fn optimal_on_common_shapes() {
        for topos in [
            shapes::nvswitch(8, 4, 2),
            shapes::pcie(4, 2, 1),
            shapes::pcie(8, 4, 2),
            shapes::bridged_pairs(8, 4, 2),
        ] {
            let all: Vec<usize> = (0..topos.len()).collect();
            for k in 1..=topos.len() {
                let got = choose(&topos, &all, &[], k).unwrap();
                assert_eq!(got.len(), k);
                assert_eq!(
                    set_cost(&topos, &got),
                    brute_min(&topos, &all, k),
                    "k={k} {topos:?}"
                );
            }
            // with holes
            let holes: Vec<usize> = all.iter().copied().filter(|i| i % 3 != 1).collect();
            for k in 1..=holes.len() {
                let got = choose(&topos, &holes, &[], k).unwrap();
                assert_eq!(set_cost(&topos, &got), brute_min(&topos, &holes, k));
            }
        }
    }

    #[test]
    fn pcie_pairs_stay_on_one_switch() {
        let topos = shapes::pcie(4, 2, 1);
        assert_eq!(choose(&topos, &[0, 1, 2, 3], &[], 2).unwrap(), vec![0, 1]);
        // best fit: 2 is alone on its switch once 3 is taken; a 1-GPU request takes it.
        assert_eq!(choose(&topos, &[0, 1, 2], &[], 1).unwrap(), vec![2]);
        assert_eq!(choose(&topos, &[0, 1, 2], &[], 2).unwrap(), vec![0, 1]);
    }

    #[test]
    fn must_include_and_errors() {
        let topos = shapes::pcie(4, 2, 1);
        assert_eq!(choose(&topos, &[0, 1, 2, 3], &[2], 2).unwrap(), vec![2, 3]);
        assert_eq!(choose(&topos, &[0, 1, 2], &[3], 1), None);
        assert_eq!(choose(&topos, &[0, 1], &[], 3), None);
        assert_eq!(choose(&topos, &[0, 1, 2, 3], &[0, 1, 2], 2), None);
        assert_eq!(choose(&topos, &[0, 1], &[], 0), Some(vec![]));
    }

    #[test]
    fn nvswitch_prefers_one_numa_node() {
        let topos = shapes::nvswitch(8, 4, 2);
        let got = choose(&topos, &(0..8).collect::<Vec<_>>(), &[], 4).unwrap();
        assert_eq!(got, vec![0, 1, 2, 3]);
    }

    #[test]
    fn nvl72_is_fast_and_local() {
        let topos: Vec<GpuTopo> = (0..72)
            .map(|i| GpuTopo {
                nvlink: Some(0),
                pcie_switch: Some(i / 4),
                numa: Some(i / 36),
            })
            .collect();
        let all: Vec<usize> = (0..72).collect();
        let got = choose(&topos, &all, &[], 8).unwrap();
        assert_eq!(set_cost(&topos, &got), ideal_cost(8));
    }
}
