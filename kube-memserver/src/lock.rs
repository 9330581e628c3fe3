//! Poison-tolerant lock helpers: a panic elsewhere must not take the whole server down.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
