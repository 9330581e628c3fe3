//! The three libm functions edgecore's binary calls (`pow`, `log`, `exp2`: Rust's float
//! methods and SQLite use them), defined in the binary from the `libm` crate (musl's
//! implementations, within 1 ULP), so that the linker resolves them here and edgecore does not
//! load `libm.so.6` at all. An idle edgecore had 0.5 MB of libm resident (its code and the
//! symbol tables the dynamic loader searches), for these three functions. A new libm import
//! (`nm -D edgecore | grep ' U '`) brings `libm.so.6` back, nothing worse.

#[unsafe(no_mangle)]
pub extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

#[unsafe(no_mangle)]
pub extern "C" fn log(x: f64) -> f64 {
    libm::log(x)
}

#[unsafe(no_mangle)]
pub extern "C" fn exp2(x: f64) -> f64 {
    libm::exp2(x)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_binarys_math_matches_the_c_library_contract() {
        assert_eq!(super::pow(2.0, 10.0), 1024.0);
        assert!(super::pow(-8.0, 1.0 / 3.0).is_nan());
        assert_eq!(super::exp2(-1.0), 0.5);
        assert!((super::exp2(0.5) - std::f64::consts::SQRT_2).abs() <= f64::EPSILON);
        assert_eq!(super::log(1.0), 0.0);
        assert!((super::log(std::f64::consts::E) - 1.0).abs() <= f64::EPSILON);
        assert_eq!(super::log(0.0), f64::NEG_INFINITY);
        assert!(super::log(-1.0).is_nan());
    }
}
