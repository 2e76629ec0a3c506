//! Rendering: values to colors through a perceptually ordered map (an 8-stop approximation of
//! matplotlib's "inferno": dark to bright, readable in grayscale) on a square-root scale (so
//! that single photons show beside bright spots), clipped at the 99.5th percentile of the
//! valid positive pixels so that a few bright spots do not wash the image out;
//! pixels that carry no value (gaps, masked, lost in transfer: NaN) are dark gray. Spots are
//! circled in cyan (a color the map never produces), and a white scale bar with its length in
//! millimetres sits in the lower left corner.

use std::io::Write;

/// An image to show: values per pixel (NaN: no value), row-major.
pub struct Shown<'a> {
    pub width: usize,
    pub height: usize,
    pub values: &'a [f32],
    /// Spot centres in pixels: (x fast, y slow).
    pub spots: &'a [(f32, f32)],
    pub pixel_size_m: f64,
}

/// RGB pixels, row-major.
pub struct Picture {
    pub width: usize,
    pub height: usize,
    pub rgb: Vec<u8>,
}

/// The color of spot circles.
pub const SPOT: [u8; 3] = [0, 255, 255];
/// The color of the scale bar and its label.
pub const BAR: [u8; 3] = [255, 255, 255];
/// Pixels without a value.
pub const NO_VALUE: [u8; 3] = [48, 48, 48];
/// Radius of the spot circles in pixels.
pub const CIRCLE: f32 = 8.0;

const INFERNO: [[f32; 3]; 8] = [
    [0.0, 0.0, 4.0],
    [40.0, 11.0, 84.0],
    [101.0, 21.0, 110.0],
    [159.0, 42.0, 99.0],
    [212.0, 72.0, 66.0],
    [245.0, 125.0, 21.0],
    [250.0, 193.0, 39.0],
    [252.0, 255.0, 164.0],
];

fn color(t: f32) -> [u8; 3] {
    let x = t.clamp(0.0, 1.0) * (INFERNO.len() - 1) as f32;
    let i = (x as usize).min(INFERNO.len() - 2);
    let f = x - i as f32;
    let (a, b) = (INFERNO[i], INFERNO[i + 1]);
    [0, 1, 2].map(|c| (a[c] + (b[c] - a[c]) * f).round() as u8)
}

/// The value shown brightest: the 99.5th percentile of the valid, positive pixels (at least 1).
fn top(values: &[f32]) -> f32 {
    let mut v: Vec<f32> = values.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
    if v.is_empty() {
        return 1.0;
    }
    let k = ((v.len() - 1) as f64 * 0.995) as usize;
    let (_, nth, _) = v.select_nth_unstable_by(k, f32::total_cmp);
    nth.max(1.0)
}

/// Renders the image with its spots and a scale bar.
pub fn render(s: &Shown) -> Picture {
    assert_eq!(s.values.len(), s.width * s.height, "values hold width x height pixels");
    let vmax = top(s.values);
    let mut rgb = Vec::with_capacity(s.values.len() * 3);
    for &v in s.values {
        rgb.extend_from_slice(&if v.is_finite() { color((v.max(0.0) / vmax).sqrt()) } else { NO_VALUE });
    }
    let mut p = Picture { width: s.width, height: s.height, rgb };
    for &(x, y) in s.spots {
        p.circle(x, y, CIRCLE);
    }
    p.scale_bar(s.pixel_size_m);
    p
}

impl Picture {
    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height {
            let at = (y as usize * self.width + x as usize) * 3;
            self.rgb[at..at + 3].copy_from_slice(&c);
        }
    }

    /// The color at (x, y).
    pub fn at(&self, x: usize, y: usize) -> [u8; 3] {
        let i = (y * self.width + x) * 3;
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    /// A ring of radius `r` (2 pixels thick) around (x, y).
    fn circle(&mut self, x: f32, y: f32, r: f32) {
        let (cx, cy) = (x.round() as i64, y.round() as i64);
        let ri = r.ceil() as i64 + 1;
        for dy in -ri..=ri {
            for dx in -ri..=ri {
                let d = ((dx * dx + dy * dy) as f32).sqrt();
                if (d - r).abs() <= 1.0 {
                    self.set(cx + dx, cy + dy, SPOT);
                }
            }
        }
    }

    /// A bar of a round number of millimetres, about a fifth of the width, labelled.
    fn scale_bar(&mut self, pixel_size_m: f64) {
        if pixel_size_m <= 0.0 || self.width < 40 || self.height < 40 {
            return;
        }
        let target_mm = self.width as f64 / 5.0 * pixel_size_m * 1e3;
        let mm = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0].into_iter().rev().find(|&m| m <= target_mm).unwrap_or(1.0);
        let len = (mm / 1e3 / pixel_size_m).round() as i64;
        let (x0, y0) = (16, self.height as i64 - 20);
        for y in y0..y0 + 5 {
            for x in x0..x0 + len {
                self.set(x, y, BAR);
            }
        }
        self.text(x0, y0 - 16, &format!("{mm} mm"));
    }

    /// Text in a 3x5 pixel font, drawn at twice its size.
    fn text(&mut self, x0: i64, y0: i64, s: &str) {
        let mut x = x0;
        for ch in s.chars() {
            for (row, bits) in glyph(ch).iter().enumerate() {
                for col in 0..3 {
                    if bits & (4 >> col) != 0 {
                        for (dx, dy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                            self.set(x + col * 2 + dx, y0 + row as i64 * 2 + dy, BAR);
                        }
                    }
                }
            }
            x += 8;
        }
    }
}

/// Rows of a 3x5 glyph (bit 2 leftmost) for the characters a scale label needs.
fn glyph(c: char) -> [u8; 5] {
    match c {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '5' => [7, 4, 7, 1, 7],
        'm' => [0, 7, 7, 5, 5],
        _ => [0; 5],
    }
}

/// Encodes the picture as an 8-bit RGB PNG.
pub fn write_png(p: &Picture, out: impl Write) -> Result<(), png::EncodingError> {
    let mut e = png::Encoder::new(out, p.width as u32, p.height as u32);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    let mut w = e.write_header()?;
    w.write_image_data(&p.rgb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spots_are_circled_gaps_dark_and_the_bar_drawn() {
        let (w, h) = (200, 100);
        let mut values: Vec<f32> = (0..w * h).map(|i| (i % 7) as f32).collect();
        values[50 * w + 10] = f32::NAN;
        let spots = [(100.0, 50.0)];
        let p = render(&Shown { width: w, height: h, values: &values, spots: &spots, pixel_size_m: 75e-6 });
        assert_eq!(p.at(108, 50), SPOT);
        assert_eq!(p.at(100, 42), SPOT);
        assert_ne!(p.at(100, 50), SPOT, "the centre stays visible");
        assert_eq!(p.at(10, 50), NO_VALUE);
        // 200 px x 75 um / 5 = 3 mm: a 2 mm bar of 27 pixels
        assert_eq!(p.at(16, 82), BAR);
        assert_eq!(p.at(16 + 26, 82), BAR);
        assert_ne!(p.at(16 + 28, 82), BAR);
        assert_eq!(color(0.0), [0, 0, 4]);
        assert_eq!(color(1.0), [252, 255, 164]);
        let mut png = Vec::new();
        write_png(&p, &mut png).unwrap();
        assert_eq!(&png[1..4], b"PNG");
    }
}
