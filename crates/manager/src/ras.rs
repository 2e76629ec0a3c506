//! The RASHPA address space (RAS): every local buffer of every receiver mapped into one
//! contiguous range, receivers in plan order, each receiver's slots back to back.

use crate::dtp::Plan;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// Index into the topology's receivers.
    pub receiver: usize,
    pub base: u64,
    pub slots: u64,
    pub slot_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressSpace {
    pub regions: Vec<Region>,
}

impl AddressSpace {
    pub fn new(plan: &Plan) -> AddressSpace {
        let mut base = 0;
        let regions = plan
            .receivers
            .iter()
            .map(|rp| {
                let r = Region { receiver: rp.receiver, base, slots: rp.slots, slot_bytes: rp.slot_bytes() };
                base += r.slots * r.slot_bytes;
                r
            })
            .collect();
        AddressSpace { regions }
    }

    /// Total bytes of the space.
    pub fn len(&self) -> u64 {
        self.regions.last().map_or(0, |r| r.base + r.slots * r.slot_bytes)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Global address of (receiver, slot, offset), if it lies in the receiver's region.
    pub fn global(&self, receiver: usize, slot: u64, offset: u64) -> Option<u64> {
        let r = self.regions.iter().find(|r| r.receiver == receiver)?;
        (slot < r.slots && offset < r.slot_bytes).then(|| r.base + slot * r.slot_bytes + offset)
    }

    /// (receiver, slot, offset) of a global address.
    pub fn resolve(&self, addr: u64) -> Option<(usize, u64, u64)> {
        let r = self.regions.iter().rev().find(|r| r.base <= addr)?;
        let rel = addr - r.base;
        (rel < r.slots * r.slot_bytes).then(|| (r.receiver, rel / r.slot_bytes, rel % r.slot_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    #[test]
    fn contiguous_and_invertible() {
        let text = "[detector]\nmodules = 4\n[transfer]\nmode = \"spatial\"\n\
            [[receivers]]\nname = \"a\"\ncontrol = \"10.0.0.1:1\"\ndata = \"10.0.0.1\"\ndata_port = 5000\nmemory_mib = 8\n\
            [[receivers]]\nname = \"b\"\ncontrol = \"10.0.0.2:1\"\ndata = \"10.0.0.2\"\ndata_port = 5000\nmemory_mib = 10\n";
        let t = Topology::from_toml(text).unwrap();
        let ras = AddressSpace::new(&Plan::new(&t).unwrap());
        assert_eq!(ras.regions[1].base, 4 * (2 << 20), "b starts where a's 4 slots end");
        assert_eq!(ras.len(), 4 * (2 << 20) + 5 * (2 << 20));
        for addr in [0, 1, (2 << 20) - 1, 4 * (2 << 20), ras.len() - 1] {
            let (r, s, o) = ras.resolve(addr).unwrap();
            assert_eq!(ras.global(r, s, o), Some(addr));
        }
        assert_eq!(ras.resolve(ras.len()), None);
        assert_eq!(ras.global(0, 4, 0), None);
    }
}
