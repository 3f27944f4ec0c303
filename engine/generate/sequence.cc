// placeholder while the engine core is written
