//! What the writer's tests share.

use rdaq_process::bitshuffle::Codec;
use rdaq_sink::{NxmxMeta, PixelType};

/// A raw series of two JUNGFRAU modules side by side, 16 images a data file.
pub fn meta() -> NxmxMeta {
    NxmxMeta {
        geometry: rdaq_detector::Geometry::new(2, 2, 8, 36).unwrap(),
        photon_energy_kev: 12.4,
        frame_time_s: 0.001,
        count_time_s: 0.001,
        detector_distance_m: 0.1,
        pixel_size_m: 75e-6,
        sensor_material: "Si".into(),
        sensor_thickness_m: 320e-6,
        start_time: "2026-11-22T00:00:00Z".into(),
        detector_name: "test".into(),
        pixel: PixelType::Raw,
        codec: Codec::Lz4,
        max_spots: 4,
        beam_center: [100.0, 200.0],
        images_per_file: 16,
        number_of_images: None,
        rotation: None,
        sample_name: "lyso".into(),
        trigger_mode: "gate".into(),
        processing: None,
        module_mask: None,
        part: None,
    }
}
