//! Directory classes kept current while the server runs: a thread that
//! reads the ext4 metadata of each volume with a `directory` class and hands
//! the blocks of the directory's files to the engine, with the blocks the
//! file system holds in use, from which the engine predicts the class of
//! writes to blocks no file is known to hold yet (docs/caching.md).

use crate::serve::{seconds_of, Config, ServeError};
use sluice_engine::{Engine, Volume};
use std::sync::Arc;

/// The thread that keeps directory classes current: every `refresh` it reads
/// the ext4 metadata of each volume with a `directory` class through the
/// volume and hands the blocks of the directory's files to the engine
/// (`Engine::set_class_extents`). A file system that cannot be read (not
/// ext4 yet, the directory missing) leaves the class matching nothing, and
/// is logged once per distinct error. Stops when dropped.
pub struct DirectoryClasses {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DirectoryClasses {
    pub fn start(cfg: &Config, engine: &Arc<Engine>) -> Result<Option<DirectoryClasses>, ServeError> {
        let mut jobs = Vec::new();
        let mut every = std::time::Duration::from_secs(5);
        for v in &cfg.volumes {
            for c in v.class.iter().filter(|c| !c.directory.is_empty()) {
                if !c.refresh.is_empty() {
                    let secs = seconds_of(&format!("volume {} class {} refresh", v.name, c.name), &c.refresh)?;
                    every = every.min(std::time::Duration::from_secs_f64(secs.max(0.01)));
                }
                jobs.push((
                    engine.volume(&v.name)?,
                    v.name.clone(),
                    c.name.clone(),
                    c.directory.clone(),
                    c.predict || c.clean_others,
                ));
            }
        }
        if jobs.is_empty() {
            return Ok(None);
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, engine) = (stop.clone(), engine.clone());
        let thread = std::thread::Builder::new()
            .name("classes".into())
            .spawn(move || {
                let mut said: std::collections::HashMap<(String, String), String> = std::collections::HashMap::new();
                while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                    for (vol, name, class, dir, predict) in &jobs {
                        let read =
                            |o: u64, b: &mut [u8]| vol.read_unaccounted(o, b).map_err(sluice_ext4::ReadError::from);
                        let found = sluice_ext4::directory_layout_via(vol.size_bytes(), 4096, read, dir);
                        let (extents, alloc, err) = match found {
                            Ok(l) => {
                                let alloc = predict.then(|| sluice_engine::Allocation {
                                    allocated: l.allocated,
                                    first_byte: l.geometry.first_byte,
                                    group_bytes: l.geometry.group_bytes,
                                });
                                (l.class, alloc, String::new())
                            }
                            Err(e) => (Vec::new(), None, e.to_string()),
                        };
                        let key = (name.clone(), class.clone());
                        if !err.is_empty() && said.get(&key) != Some(&err) {
                            eprintln!("sluice: volume {name:?} class {class:?}: directory {dir:?}: {err}");
                        }
                        said.insert(key, err);
                        let known = alloc.is_some();
                        let _ = engine.set_class_layout(name, class, extents, alloc);
                        // Others' dirty blocks home, 512 KiB per step (the
                        // disk writes without the engine's lock when a
                        // device-queue permit allows). The thread rests as
                        // long as each step took: at most half of the
                        // disk's time goes to it.
                        while known && !flag.load(std::sync::atomic::Ordering::Relaxed) {
                            let t = std::time::Instant::now();
                            match engine.clean_others(name, 128) {
                                Ok(step) if step.cleaned_bytes > 0 => std::thread::sleep(t.elapsed()),
                                _ => break,
                            }
                        }
                    }
                    let t = std::time::Instant::now();
                    while t.elapsed() < every && !flag.load(std::sync::atomic::Ordering::Relaxed) {
                        std::thread::sleep(std::time::Duration::from_millis(20).min(every));
                    }
                }
            })
            .map_err(|source| ServeError::Io { what: "the directory classes' thread".into(), source })?;
        Ok(Some(DirectoryClasses { stop, thread: Some(thread) }))
    }
}

impl Drop for DirectoryClasses {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
