"""Run by Debian's system Python, where DIALS lives (not in the test venv): prints as JSON
what DIALS made of an imported run (experiments) and the spots it found (reflections, when
given)."""
import json
import sys

from dials.array_family import flex
from dxtbx.model.experiment_list import ExperimentListFactory

expts = ExperimentListFactory.from_json_file(sys.argv[1], check_format=False)
refl = flex.reflection_table.from_file(sys.argv[2]) if len(sys.argv) > 2 else flex.reflection_table()
det = expts[0].detector
x, y, _ = refl["xyzobs.px.value"].parts() if len(refl) else ([], [], [])
print(json.dumps({
    "images": len(expts),
    "wavelength": expts[0].beam.get_wavelength(),
    "panels": [{"name": p.get_name(), "image_size": list(p.get_image_size()), "pixel_size": list(p.get_pixel_size()),
                "origin": list(p.get_origin()), "distance": p.get_distance()} for p in det],
    "spots": [[int(refl["id"][i]), int(refl["panel"][i]), x[i], y[i]] for i in range(len(refl))],
}))
