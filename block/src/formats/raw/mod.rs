//! Raw images: the virtual disk is the file, byte for byte. The open
//! image is [`RawImage`] (`image`); raw's entry in the format registry
//! is [`DRIVER`] (`driver`).

mod driver;
mod image;

pub(crate) use driver::check_options;
pub use driver::DRIVER;
pub use image::RawImage;
