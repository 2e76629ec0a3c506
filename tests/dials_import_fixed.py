"""Run by Debian's system Python, where DIALS lives: imports an NXmx master with dxtbx after
the fix that dxtbx made upstream for modules side by side (the slice of the pixel mask
made contiguous before flex takes it; Debian 12's dxtbx raises "numpy array is
non-c-contiguous" there), and prints as JSON the panels and how many pixels each panel's
static mask masks."""
import json
import sys

import dxtbx.nexus
import numpy as np
from dxtbx.model.experiment_list import ExperimentListFactory
from scitbx.array_family import flex

_slices = dxtbx.nexus.get_detector_module_slices


def get_static_mask(nxdetector):
    mask = nxdetector.pixel_mask
    if mask is None or not mask.size or mask.ndim != 2:
        return None
    return tuple(dxtbx.nexus.flumpy.from_numpy(np.ascontiguousarray(mask[s])) == 0 for s in _slices(nxdetector))


dxtbx.nexus.get_static_mask = get_static_mask
expts = ExperimentListFactory.from_filenames([sys.argv[1]])
imageset = expts[0].imageset
masks = imageset.get_format_class().get_instance(sys.argv[1]).get_static_mask()
print(json.dumps({
    "images": len(expts),
    "panels": [{"image_size": list(p.get_image_size()), "origin": list(p.get_origin())} for p in expts[0].detector],
    "masked": [int(flex.sum((~m).as_1d().as_int())) for m in masks],
}))
